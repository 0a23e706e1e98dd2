"""JSON in and out of the routes that read their own body (the worker protocol's claim and
report, the requests a busy server answers hundreds of times a second).

FastAPI's machinery around a route (dependencies solved one by one, each synchronous one in a
trip through the thread pool; the body validated, then the answer validated again against the
response model and encoded) cost more server time than the work itself. These routes take the
``Request``, and use the helpers here to do what FastAPI did, the same way, once:

* ``read_json``: the body decoded as FastAPI decodes a JSON body parameter, with the same
  errors (a 422 naming where the JSON broke, a 400 for undecodable bytes, 413 from the body
  limit). It is the standard library's decoder on purpose: it is FastAPI's, so NaN and
  Infinity (a worker's unreadable measurement, refused per result, not per request), integers
  beyond 64 bits and a byte-order mark are read exactly as before. orjson reads those
  differently and would save about a microsecond per result.
* ``validate``: the pydantic schema itself decides, so the rules and limits stay those of
  ``worker_schemas.py`` and an invalid body gets the same 422 (``errors._validation_error``).
* ``json_response``: the answer encoded in one step (orjson), without a second validation.
* ``raw_body_doc``: the request body in the OpenAPI document (``openapi_extra``), since FastAPI
  cannot see a body the route reads itself.
"""

from __future__ import annotations

import email.message
import json
from typing import Any, Final, TypeVar

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

M = TypeVar("M", bound=BaseModel)

class _NoBody:
    """An empty body (FastAPI's ``Undefined``): the body parameter is then missing."""


NO_BODY: Final = _NoBody()


async def read_json(request: Request) -> Any:
    """The decoded body; the raw bytes when it is not declared JSON (the schema then refuses
    them), ``NO_BODY`` when empty. Raises what FastAPI raises for a body it cannot decode."""
    body = await request.body()
    if not body:
        return NO_BODY
    if not _declares_json(request.headers.get("content-type")):
        return body
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
            "input": {}, "ctx": {"error": e.msg}}]) from e
    except Exception as e:  # undecodable bytes; RecursionError: errors._http_error's 422
        raise HTTPException(400, "There was an error parsing the body") from e


def _declares_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters allowed; without a
    content type FastAPI (strict by default) does not decode the body either."""
    if content_type == "application/json":
        return True
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json"))


def validate(model: type[M], body: Any) -> M:
    """``body`` as ``model``, or the 422 FastAPI answers for an invalid body parameter."""
    if body is NO_BODY:
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required", "input": None}])
    try:  # a fresh context: the body's tree is checked once (``schemas.Body``)
        return model.model_validate(body, from_attributes=True, context={})
    except ValidationError as e:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in e.errors()]) from e


def json_response(content: Any, status_code: int = 200) -> Response:
    """``content`` (plain JSON values, dataclass-free) as one JSON answer."""
    return Response(orjson.dumps(content), status_code=status_code,
                    media_type="application/json")


def raw_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting ``model`` as the required JSON body of a route that reads
    its body itself. The schema's definitions are inlined: they are not among the document's
    components, and a ``#/$defs/...`` reference would point at the document's root."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return inline({**defs[ref.removeprefix("#/$defs/")], **rest})
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": inline(schema)}}}}
