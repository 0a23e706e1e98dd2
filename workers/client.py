"""The worker side of docs/worker-protocol.md, over HTTP(S) with httpx.

Transport failures, timeouts and 5xx answers raise ``ServerUnavailable`` (retry later); other
4xx answers raise ``ServerRejected``; a malformed answer raises ``ProtocolError``.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from schedule_templates.protocol import MeasureId
from workers.errors import ProtocolError, ServerRejected, ServerUnavailable

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
#: answers that mean "not now" rather than "never"
_RETRYABLE = {408, 425, 429}
#: the longest ``Retry-After`` honoured (a server asking for more is retried sooner anyway)
MAX_RETRY_AFTER_S = 300.0


class ServerClient:
    def __init__(self, server: str, token: str, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        base = server.rstrip("/")
        if not base.endswith(API_PREFIX):
            base += API_PREFIX
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=base,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "tuner-worker"},
            timeout=timeout_s,
            transport=transport,
        )

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def register(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._post("/workers/register", body)
        if "worker_id" not in answer:
            raise ProtocolError(f"register answered without a worker_id: {answer}")
        return answer

    def heartbeat(self, worker_id: str, measure_ids: list[MeasureId]) -> dict[str, Any]:
        return self._post(f"/workers/{worker_id}/heartbeat", {"measure_ids": measure_ids})

    def claim(self, worker_id: str, max_items: int, wait_s: float) -> list[dict[str, Any]]:
        answer = self._post(f"/workers/{worker_id}/claim",
                            {"max_items": max_items, "wait_s": wait_s},
                            timeout_s=wait_s + self.timeout_s)
        items = answer.get("items")
        if not isinstance(items, list):
            raise ProtocolError(f"claim answered without an items list: {answer}")
        return items

    def report(self, worker_id: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        return self._post(f"/workers/{worker_id}/results", {"results": results})

    def release(self, worker_id: str, measure_ids: list[MeasureId]) -> list[MeasureId]:
        answer = self._post(f"/workers/{worker_id}/release", {"measure_ids": measure_ids})
        return list(answer.get("released", []))

    def _post(self, path: str, body: dict[str, Any], timeout_s: float | None = None
              ) -> dict[str, Any]:
        try:
            response = self._http.post(path, json=body, timeout=timeout_s or self.timeout_s)
        except httpx.TransportError as e:  # connect/read errors and timeouts
            raise ServerUnavailable(f"POST {path}: {type(e).__name__}: {e}") from e
        status = response.status_code
        if status >= 500 or status in _RETRYABLE:
            raise ServerUnavailable(f"POST {path}: server answered {status}",
                                    _retry_after(response))
        if status >= 400:
            raise ServerRejected(status, f"POST {path}: {response.text[:500]}")
        try:
            data = response.json()
        except ValueError as e:
            raise ProtocolError(f"POST {path}: answer is not JSON: {response.text[:200]}") from e
        if not isinstance(data, dict):
            raise ProtocolError(f"POST {path}: answer is not an object: {data!r}")
        return data


def _retry_after(response: httpx.Response) -> float | None:
    """The ``Retry-After`` of an answer in seconds (the delay form; an HTTP date is ignored)."""
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return min(seconds, MAX_RETRY_AFTER_S) if seconds >= 0 else None
