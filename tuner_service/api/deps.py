"""Dependencies: settings, database session, bearer-token roles, lookup-or-404.

Routes list their auth dependency (``UserToken``, ``WorkerToken``, ``Reader``) first: FastAPI
solves dependencies in parameter order, and the token check runs in its own short read
transaction, which ends before the request's session starts.

The request's session follows the HTTP method: GET and HEAD only read, so they get a read
session (on SQLite a deferred transaction that never takes or waits for the write lock); every
other method gets a write session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from tuner_service import auth
from tuner_service.api.schemas import MAX_ID
from tuner_service.db.engine import Database
from tuner_service.db.models import Job, Token, Worker
from tuner_service.errors import AuthError, ForbiddenError, NotFoundError
from tuner_service.jobs.driver import JobDriver
from tuner_service.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="a token from `tuner token create`")


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_driver(request: Request) -> JobDriver | None:
    driver: JobDriver | None = getattr(request.app.state, "driver", None)
    return driver


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Database, Depends(get_db)]
DriverDep = Annotated[JobDriver | None, Depends(get_driver)]


READ_METHODS = frozenset({"GET", "HEAD"})


def get_session(db: DbDep, request: Request) -> Iterator[Session]:
    scope = db.read_session if request.method in READ_METHODS else db.session
    with scope() as session:
        yield session


# scope="function": commit before the answer leaves, so a client never reads behind its write
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _token(db: Database, credentials: HTTPAuthorizationCredentials | None) -> Token:
    if credentials is None or not credentials.credentials:
        raise AuthError("missing bearer token (Authorization: Bearer <token>)")
    with db.read_session() as session:
        token = auth.authenticate(session, credentials.credentials)
    if token is None:
        raise AuthError("invalid or revoked token")
    return token


def require(*roles: str) -> Callable[[DbDep, Credentials], Token]:
    def dependency(db: DbDep, credentials: Credentials) -> Token:
        token = _token(db, credentials)
        if not auth.allows(token.role, roles):
            raise ForbiddenError(f"a {token.role} token cannot do this; needs {' or '.join(roles)}")
        return token

    return dependency


def reader(db: DbDep, settings: SettingsDep, credentials: Credentials) -> Token | None:
    """Reads are open unless ``read_requires_token`` is set; then a user or admin token reads
    everything, and a worker token only the reads that use this dependency (``Reader``)."""
    if not settings.read_requires_token:
        return None
    return _token(db, credentials)


def user_reader(db: DbDep, settings: SettingsDep, credentials: Credentials) -> Token | None:
    """A read of user data (jobs, models, records, the dashboard): with ``read_requires_token``
    a worker token is refused (403), so a leaked worker token reads no one's jobs."""
    token = reader(db, settings, credentials)
    if token is not None and not auth.allows(token.role, ("user",)):
        raise ForbiddenError("a worker token reads only what workers need (health, best "
                             "configs); use a user token")
    return token


UserToken = Annotated[Token, Depends(require("user"))]
WorkerToken = Annotated[Token, Depends(require("worker"))]
#: reads a worker token may make too: the shared tuning log, packs, metrics
Reader = Annotated[Token | None, Depends(reader)]
#: reads of user data: jobs, models, records, the dashboard
UserReader = Annotated[Token | None, Depends(user_reader)]


def job_or_404(session: SessionDep, job_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    return job


#: a worker's id in a path (``/workers/{worker_id}/...``)
WorkerId = Annotated[int, Path(ge=1, le=MAX_ID)]


def own_worker(db: DbDep, credentials: Credentials, worker_id: WorkerId) -> Worker:
    """The worker row, which only the token that registered it (or an admin) may act for.

    The token check (a worker or admin token) and the worker lookup share one short read
    transaction: every heartbeat and release starts here (claims and reports through the
    short-lived cache of ``api.worker_auth``), so it costs one pooled connection, not two. Not
    held open: the long-poll claim must not keep a transaction (on SQLite an open write
    transaction would block every other writer for the whole wait)."""
    if credentials is None or not credentials.credentials:
        raise AuthError("missing bearer token (Authorization: Bearer <token>)")
    return worker_for_token(db, credentials.credentials, worker_id)


def worker_for_token(db: Database, secret: str, worker_id: int) -> Worker:
    """The worker ``secret`` may act for (``own_worker``; ``api.worker_auth`` caches it), or
    AuthError, ForbiddenError, NotFoundError saying why not."""
    with db.read_session() as session:
        token = auth.authenticate(session, secret)
        worker = session.get(Worker, worker_id) if token is not None else None
    if token is None:
        raise AuthError("invalid or revoked token")
    if not auth.allows(token.role, ("worker",)):
        raise ForbiddenError(f"a {token.role} token cannot do this; needs worker")
    if worker is None:
        raise NotFoundError(f"worker {worker_id} not found; register again")
    if token.role != "admin" and worker.token_id != token.id:
        raise ForbiddenError(f"worker {worker_id} was registered with another token")
    return worker


def owned_job(token: UserToken, job: Annotated[Job, Depends(job_or_404)]) -> Job:
    """A job the token may change: its creator's token, or any admin token."""
    if token.role != "admin" and job.owner_token_id != token.id:
        raise ForbiddenError(f"job {job.id} belongs to another token; only its owner or an "
                             "admin may change it")
    return job


JobDep = Annotated[Job, Depends(job_or_404)]
OwnedJob = Annotated[Job, Depends(owned_job)]
WorkerDep = Annotated[Worker, Depends(own_worker)]
