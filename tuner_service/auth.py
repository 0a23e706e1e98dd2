"""Bearer tokens with roles. Only a SHA-256 of each random secret is stored.

Roles: ``admin`` (everything), ``user`` (models, jobs, record imports), ``worker`` (the worker
endpoints). A token never grants a role other than its own, except that admin may do anything.
A worker token may be bound to one device key: it then registers workers for that key only.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_service.db.models import Token
from tuner_service.errors import InvalidInputError

logger = logging.getLogger(__name__)

ROLES = ("admin", "user", "worker")
_PREFIX = "tnr_"


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_secret() -> str:
    return _PREFIX + secrets.token_urlsafe(32)


def create_token(session: Session, role: str, name: str = "", secret: str | None = None,
                 device_key: str | None = None) -> tuple[Token, str]:
    """Store a new token and return it with its secret (shown once, never stored)."""
    if role not in ROLES:
        raise InvalidInputError(f"unknown role {role!r}; choose from {', '.join(ROLES)}")
    if device_key is not None and (role != "worker" or not device_key.strip()
                                   or len(device_key) > 255):
        raise InvalidInputError("--device-key binds a worker token to one non-empty device key "
                                "(at most 255 characters); other roles take none")
    secret = secret or new_secret()
    token = Token(name=name, role=role, token_hash=hash_token(secret), revoked=False,
                  device_key=device_key)
    session.add(token)
    session.flush()
    logger.info("created %s token %d (%s)%s", role, token.id, name or "unnamed",
                f" for device key {device_key}" if device_key else "")
    return token, secret


def ensure_token(session: Session, secret: str, role: str, name: str) -> Token:
    """Store ``secret`` as a token unless it is already known (deployment bootstrap)."""
    found = authenticate(session, secret)
    if found is not None:
        return found
    return create_token(session, role, name, secret)[0]


def authenticate(session: Session, secret: str) -> Token | None:
    """The live token for ``secret``, or None."""
    digest = hash_token(secret)
    token = session.scalar(select(Token).where(Token.token_hash == digest))
    if token is None or token.revoked:
        return None
    # The lookup is by hash already; the constant-time compare guards against a lookup
    # that matched by collation or truncation rather than by the exact digest.
    if not hmac.compare_digest(token.token_hash, digest):
        return None
    return token


def allows(token_role: str, needed: tuple[str, ...]) -> bool:
    return token_role == "admin" or token_role in needed


def revoke(session: Session, token_id: int) -> bool:
    token = session.get(Token, token_id)
    if token is None:
        return False
    token.revoked = True
    return True
