"""Pre-tuned packs per device class: serve one (export or resolved for a build), import one."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from tuner_service.api.deps import DbDep, Reader, SessionDep, SettingsDep, UserToken
from tuner_service.api.routes.shared import _read_body
from tuner_service.api.schemas import PackImported, PackPublic
from tuner_service.db.values import check_tree
from tuner_service.errors import InvalidInputError
from tuner_service.jobs import packs

router = APIRouter(tags=["tuning log"])


@router.get("/packs", response_model=PackPublic)
def get_pack(
    _reader: Reader,
    session: SessionDep,
    device_class: Annotated[str, Query(min_length=1, max_length=255)],
    target: Annotated[str | None, Query(max_length=255)] = None,
    threads: Annotated[int | None, Query(ge=1, le=4096)] = None,
    resolve: bool = False,
) -> dict[str, Any]:
    """The entries of ``device_class``; with ``resolve``, for every workload on ``target`` the
    entry a lookup for that class and thread count finds (``match`` on each)."""
    return packs.export_pack(session, device_class, target, threads, resolve)


@router.post("/packs", response_model=PackImported)
async def post_pack(
    _token: UserToken,
    request: Request,
    db: DbDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """A pack as exported; every entry is validated, then all are stored in one transaction."""
    raw = await _read_body(request, settings.max_upload_bytes)
    try:
        pack = json.loads(raw)
        check_tree(pack)  # finite numbers, clean text, bounded nesting (as every request body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError included
        raise InvalidInputError(f"a pack must be plain JSON: {str(e)[:300]}") from e

    def store() -> dict[str, Any]:
        with db.session() as session:
            return packs.import_pack(session, pack)

    answer: dict[str, Any] = await run_in_threadpool(store)
    return answer
