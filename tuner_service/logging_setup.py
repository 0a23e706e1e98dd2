"""Process logging for every ``tuner`` command: human text or one JSON object per line.

``TUNER_LOG_FORMAT=json`` (or ``tuner --log-format json``) makes the server, the worker and the
CLI write JSON lines to stderr, ready for a log shipper (Loki, Elasticsearch, CloudWatch). Only
the standard library is used, so it works on a worker-only install. The format is read from the
environment here, before any settings object exists: logging is configured first, so that the
settings and database code can already log.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from typing import Any, TextIO

ENV_LOG_FORMAT = "TUNER_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, process,
    thread, the exception if any, and every field passed with ``extra=``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "thread": record.threadName,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def resolve_format(flag: str | None) -> str:
    """The ``--log-format`` flag, else ``TUNER_LOG_FORMAT``, else text."""
    value = (flag or os.environ.get(ENV_LOG_FORMAT) or "text").strip().lower()
    if value not in FORMATS:
        raise ValueError(f"{ENV_LOG_FORMAT} must be one of {', '.join(FORMATS)}, got {value!r}")
    return value


def make_formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


class _TunerHandler(logging.StreamHandler[TextIO]):
    """The stderr handler ``configure`` installs (marked, so a second call replaces it)."""


def configure(log_format: str, level: int = logging.INFO) -> bool:
    """Send all records to one stderr handler in ``log_format``.

    Like ``logging.basicConfig``, it leaves a root logger that someone else already equipped
    alone (an embedding application, pytest's capture) and returns False then.
    """
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _TunerHandler)]
    if len(ours) != len(root.handlers):
        return False
    for old in ours:
        root.removeHandler(old)
    handler = _TunerHandler()
    handler.setFormatter(make_formatter(log_format))
    root.addHandler(handler)
    root.setLevel(level)
    return True


def uvicorn_log_config(log_format: str) -> dict[str, Any] | None:
    """A ``log_config`` for uvicorn: in JSON mode its own loggers (startup lines, access log)
    go through the root handler too, instead of the text handlers uvicorn installs."""
    if log_format != "json":
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {name: {"handlers": [], "propagate": True}
                    for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
    }


#: libraries that log every request or migration step at INFO; kept at WARNING unless ``-v``
QUIET_LIBRARIES = ("httpx", "httpcore", "alembic", "multipart", "urllib3")


def quiet_libraries(level: int = logging.WARNING) -> None:
    """Raise chatty third-party loggers to ``level`` (HTTP request lines, Alembic steps)."""
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(level)
