"""The request body limit, enforced while the body streams in.

A route that parses a multipart upload only runs after the whole body has been spooled (to
memory, then to a temporary file), so a check inside the route comes too late for a body that
is gigabytes long or sent without a ``Content-Length``. This ASGI middleware counts bytes as they
arrive and stops the request with 413 the moment it passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: what a multipart body may carry beyond the file itself (boundaries, part headers)
FRAMING_SLACK = 64 * 1024


class BodyTooLarge(HTTPException):
    """Raised from ``receive``: FastAPI passes HTTPExceptions from body parsing through as is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than the {limit}-byte limit")


class BodyLimit:
    """Refuse request bodies longer than ``limit`` bytes (declared or actually sent)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _refuse(send, self.limit)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body larger than the {limit}-byte limit"}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"),
                          (b"content-length", str(len(body)).encode()),
                          (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
