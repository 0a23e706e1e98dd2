"""Who may act for a worker, remembered for a moment: the claim and report routes' token check.

Every claim and every report names a worker and carries a bearer token. Checking the pair
(``deps.worker_for_token``) is a read transaction of its own: on PostgreSQL the pool's ping,
the token, the worker row and the commit, four round trips and a trip through the thread pool,
paid again by each of the hundreds of requests a busy server answers per second.

``WorkerGrants`` keeps each granted (token, worker) pair for ``ttl_s`` seconds
(``Settings.worker_auth_cache_s``, 2 s by default). The price is staleness, and it is bounded: a
token revoked, or a worker deleted or re-registered under another token, is refused at the
latest ``ttl_s`` after the change, because an entry is never renewed, only looked up again once
it has expired. Only grants are kept; every refusal (unknown or revoked token, wrong role, another
token's worker) is looked up afresh, so nothing a client sends can fill the cache with refusals.

The grants are read and written on the event loop only (the routes are ``async``): no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from tuner_service.api.deps import worker_for_token
from tuner_service.auth import hash_token
from tuner_service.db.engine import Database
from tuner_service.db.models import Worker
from tuner_service.errors import AuthError

MISSING_TOKEN = "missing bearer token (Authorization: Bearer <token>)"
#: grants kept at most; past it the expired ones go, then the oldest
MAX_GRANTS = 10_000


class WorkerGrants:
    """(token digest, worker id) -> the worker row, each for ``ttl_s`` seconds (0: off)."""

    def __init__(self, ttl_s: float, max_grants: int = MAX_GRANTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._max = max_grants
        self._clock = clock
        self._grants: dict[tuple[str, int], tuple[float, Worker]] = {}

    def get(self, digest: str, worker_id: int) -> Worker | None:
        entry = self._grants.get((digest, worker_id))
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._grants[(digest, worker_id)]
            return None
        return entry[1]

    def put(self, digest: str, worker_id: int, worker: Worker) -> None:
        if self.ttl_s <= 0:
            return
        now = self._clock()
        if len(self._grants) >= self._max:
            self._grants = {k: v for k, v in self._grants.items() if v[0] > now}
            while len(self._grants) >= self._max:  # dicts keep insertion order: oldest first
                del self._grants[next(iter(self._grants))]
        self._grants[(digest, worker_id)] = (now + self.ttl_s, worker)

    def __len__(self) -> int:
        return len(self._grants)


def bearer_secret(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, else "" (as FastAPI's
    ``HTTPBearer`` reads it: scheme case-insensitive, the token stripped)."""
    if not authorization:
        return ""
    scheme, _, secret = authorization.partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else ""


async def authorized_worker(request: Request, worker_id: int) -> Worker:
    """The worker this request's token may act for, else AuthError, ForbiddenError or
    NotFoundError (``deps.worker_for_token``); a grant is reused for ``ttl_s`` seconds."""
    secret = bearer_secret(request.headers.get("authorization"))
    if not secret:
        raise AuthError(MISSING_TOKEN)
    grants: WorkerGrants = request.app.state.worker_grants
    digest = hash_token(secret)
    worker = grants.get(digest, worker_id)
    if worker is None:
        db: Database = request.app.state.db
        worker = await run_in_threadpool(worker_for_token, db, secret, worker_id)
        grants.put(digest, worker_id, worker)
    return worker
