"""How the CLI reports a mistake: one line on stderr, exit code 2, never a traceback.

Handlers raise ``UsageError`` for bad input they find themselves; ``user_error`` recognises the
foreign exceptions a user's input causes (an unreachable or unsupported database, a missing
optional package) so ``main`` can report them the same way. Anything else is a bug and raises.
"""

from __future__ import annotations

import re

EXIT_BAD_INPUT = 2

#: optional packages a command may need, and what installs them
_INSTALL_HINTS = {
    "pycuda": "pip install '.[cuda]' (see docs/cuda.md)",
    "MySQLdb": "MySQL is not supported: use SQLite or PostgreSQL",
    "pymysql": "MySQL is not supported: use SQLite or PostgreSQL",
    "psycopg2": "use postgresql+psycopg:// (psycopg 3 is installed)",
    "onnx": "pip install '.[server]'",
    "onnxruntime": "pip install onnxruntime",
    "fastapi": "pip install '.[server]'",
    "sqlalchemy": "pip install '.[server]'",
    "xgboost": "pip install '.[server]'",
}


class UsageError(Exception):
    """Bad input found by a command; the message is the whole report."""


def first_line(text: object, limit: int = 300) -> str:
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def hide_password(text: str) -> str:
    return re.sub(r"(://[^:/@\s]+:)[^@\s]+@", r"\1***@", text)


def user_error(error: BaseException) -> str | None:
    """The one-line message for an error the user's input caused, or None for a bug."""
    if isinstance(error, UsageError):
        return str(error)
    if isinstance(error, ModuleNotFoundError) and error.name:
        root = error.name.split(".")[0]
        if root in _INSTALL_HINTS:
            return f"{root} is not installed: {_INSTALL_HINTS[root]}"
        return None
    message = _database_error(error)
    if message is not None:
        return message
    from schedule_templates.errors import ScheduleError
    from tuner_service.errors import TunerServiceError
    from workers.errors import WorkerError

    if isinstance(error, ScheduleError | WorkerError):
        return first_line(str(error))
    if isinstance(error, TunerServiceError):
        cause = error.__cause__
        detail = f" ({first_line(getattr(cause, 'orig', None) or cause)})" if cause else ""
        return hide_password(first_line(str(error)) + detail)
    return None


def check_database_url(url: str) -> None:
    """Refuse a URL of a database we do not support before any driver is imported."""
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme not in ("sqlite", "postgresql", "postgres"):
        raise UsageError(f"unsupported database URL {hide_password(url)!r}: use "
                         "sqlite:///FILE or postgresql+psycopg://USER@HOST/DB")


def _database_error(error: BaseException) -> str | None:
    try:
        from sqlalchemy import exc
    except ImportError:
        return None
    if isinstance(error, exc.NoSuchModuleError | exc.ArgumentError):
        return hide_password(f"unsupported database URL: {first_line(str(error))} "
                             "(use sqlite:///FILE or postgresql+psycopg://USER@HOST/DB)")
    if isinstance(error, exc.DBAPIError):
        return hide_password(f"database error: {first_line(str(error.orig))}")
    return None
