"""``tuner serve``, ``tuner db upgrade|current``, ``tuner token create``, ``tuner up``.

``tuner up`` is the embedded one-machine mode: SQLite in the data directory, the server in this
process, one local CPU worker as a subprocess, a sample model tuned with a small budget.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _settings(args: argparse.Namespace, **extra: Any) -> Any:
    from tuner_service.cli.errors import check_database_url
    from tuner_service.settings import get_settings

    settings = get_settings().with_overrides(database_url=getattr(args, "database", None),
                                             **extra)
    check_database_url(settings.resolved_database_url)
    return settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from tuner_service.app import create_app
    from tuner_service.db.migrate import check_schema
    from tuner_service.errors import TunerServiceError

    settings = _settings(args, host=args.host, port=args.port,
                         access_log=getattr(args, "access_log", None))
    try:
        check_schema(settings.resolved_database_url)
    except TunerServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from uvicorn.config import LOGGING_CONFIG

    from tuner_service.logging_setup import uvicorn_log_config

    # in JSON mode uvicorn's own lines (startup, access log) go through the JSON handler too
    log_config = uvicorn_log_config(getattr(args, "log_format", "text")) or LOGGING_CONFIG
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level="info", proxy_headers=True, log_config=log_config,
                access_log=settings.access_log)
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    from tuner_service.db.migrate import current_revision, upgrade

    url = _settings(args).resolved_database_url
    upgrade(url, args.revision)
    print(f"database at revision {current_revision(url)}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    from tuner_service.db.migrate import current_revision, head_revision

    current, head = current_revision(_settings(args).resolved_database_url), head_revision()
    print(f"current: {current or 'none (empty database)'}\nhead:    {head}")
    return 0 if current == head else 1


def _token_create(args: argparse.Namespace) -> int:
    from tuner_service import auth
    from tuner_service.db.engine import Database
    from tuner_service.errors import TunerServiceError

    db = Database(_settings(args).resolved_database_url)
    try:
        with db.session() as session:
            token, secret = auth.create_token(session, args.role, args.name or "",
                                              device_key=args.device_key)
    except TunerServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print(secret)
    print(f"(token {token.id}, role {token.role}: shown once, stored hashed)", file=sys.stderr)
    return 0


# ---- tuner up ---------------------------------------------------------------------------------

def _model_bytes(model: str) -> tuple[bytes, str]:
    """A path to an ONNX file, else the name of a built-in sample model."""
    path = Path(model)
    if path.suffix.lower() == ".onnx" or path.exists():
        try:
            return path.read_bytes(), path.name
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from e
    from tuner_service.compiler.frontend.samples import SAMPLE_MODELS, sample_model_bytes

    if model not in SAMPLE_MODELS:
        raise ValueError(f"--model {model!r} is neither an ONNX file nor a sample model "
                         f"({', '.join(SAMPLE_MODELS)})")
    return sample_model_bytes(model), f"{model}.onnx"


def _up(args: argparse.Namespace) -> int:
    from tuner_service.tuning.embedded import LocalWorkers, local_service

    threads = args.threads or os.cpu_count() or 1
    try:
        model = _model_bytes(args.model)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = _settings(args, data_dir=args.data_dir, host="127.0.0.1", port=args.port)
    workers = LocalWorkers(count=1, threads=threads, parallel_build=os.cpu_count() or 1,
                           verbose=args.verbose)
    with local_service(settings, workers) as service:
        print(f"server on {service.url} (database {service.database_url})")
        print(f"local worker log: {service.worker_logs[0]}")
        code = _run_job(args, service.url, service.token, model, threads)
        if args.serve or args.no_wait:
            print(f"dashboard: {service.url}/  serving until Ctrl-C", flush=True)
            _serve_forever()
        else:
            print("the server stopped with the job (`tuner up --serve` keeps it serving)")
    return code


def _run_job(args: argparse.Namespace, url: str, token: str, model: tuple[bytes, str],
             threads: int) -> int:
    """Upload the model and tune it, showing progress (with --no-wait: submit only)."""
    from tuner_service.cli.client import ClientError, ServiceClient, wait_for
    from tuner_service.db.states import JobStatus

    client = ServiceClient(url, token)
    try:
        uploaded = client.upload_model(*model)
        job_id = client.create_job(
            model_id=uploaded["model_id"], target="llvm", device_key="local",
            trials_per_task=args.trials_per_task, tuner=args.tuner, threads=threads)
        print(f"job {job_id}: {model[1]}, {len(uploaded['tasks'])} tasks, "
              f"{args.trials_per_task} trials each; dashboard {url}/jobs/{job_id}", flush=True)
        if args.no_wait:
            return 0
        final = wait_for(client, job_id)
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0 if final["status"] == JobStatus.DONE else 1


def _serve_forever() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser("serve", help="run the tuning server")
    serve.add_argument("--host", default=None, help="default 127.0.0.1 (TUNER_HOST)")
    serve.add_argument("--port", type=int, default=None, help="default 8000 (TUNER_PORT)")
    serve.add_argument("--database", default=None, help="database URL (TUNER_DATABASE_URL)")
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                       help="one log line per request (default on; TUNER_ACCESS_LOG)")
    serve.set_defaults(func=_serve)

    db = subparsers.add_parser("db", help="database migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="create or upgrade the tables (Alembic)")
    up.add_argument("--database", default=None)
    up.add_argument("--revision", default="head")
    up.set_defaults(func=_db_upgrade)
    current = db_sub.add_parser("current", help="show the schema revision and the head")
    current.add_argument("--database", default=None)
    current.set_defaults(func=_db_current)

    token = subparsers.add_parser("token", help="API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token and print it once")
    create.add_argument("--role", required=True, choices=("admin", "user", "worker"))
    create.add_argument("--name", default=None)
    create.add_argument("--device-key", default=None,
                        help="worker tokens: register workers for this device key only")
    create.add_argument("--database", default=None)
    create.set_defaults(func=_token_create)

    _register_up(subparsers)


def _register_up(subparsers: Any) -> None:
    up = subparsers.add_parser("up", help="one machine: server + local worker + sample model")
    up.add_argument("--trials-per-task", type=int, default=16)
    up.add_argument("--model", default="resnet18",
                    help="an ONNX file or a sample model name (default resnet18)")
    up.add_argument("--tuner", default="xgb-transfer")
    up.add_argument("--port", type=int, default=8000, help="default 8000, else any free port")
    up.add_argument("--threads", type=int, default=None,
                    help="threads per measurement (default: all cores)")
    up.add_argument("--data-dir", type=Path, default=None)
    up.add_argument("--database", default=None, help="default: SQLite in the data dir")
    up.add_argument("--no-wait", action="store_true", help="submit, then serve until Ctrl-C")
    up.add_argument("--serve", action="store_true", help="keep serving after the job ends")
    up.set_defaults(func=_up)
