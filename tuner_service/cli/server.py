"""``tuner serve``, ``tuner db upgrade|current``, ``tuner token create``, ``tuner up``.

``tuner up`` is the embedded one-machine mode: SQLite in the data directory, the server in this
process, one local CPU worker as a subprocess, a sample model tuned with a small budget.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _settings(args: argparse.Namespace, **extra: Any) -> Any:
    from tuner_service.settings import get_settings

    if not getattr(args, "verbose", False):
        logging.getLogger("alembic").setLevel(logging.WARNING)  # per-plugin INFO lines

    return get_settings().with_overrides(database_url=getattr(args, "database", None), **extra)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from tuner_service.api import create_app
    from tuner_service.db.errors import TunerServiceError
    from tuner_service.db.migrate import check_schema

    settings = _settings(args, host=args.host, port=args.port)
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
                log_level="info", proxy_headers=True, log_config=log_config)
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
    from tuner_service.db.errors import TunerServiceError

    db = Database(_settings(args).resolved_database_url)
    try:
        with db.session() as session:
            token, secret = auth.create_token(session, args.role, args.name or "")
    except TunerServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print(secret)
    print(f"(token {token.id}, role {token.role}: shown once, stored hashed)", file=sys.stderr)
    return 0


# ---- tuner up ---------------------------------------------------------------------------------

def _free_port(host: str, wanted: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind((host, wanted))
            return wanted
        except OSError:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])


def _embedded_tokens(settings: Any) -> dict[str, str]:
    """Reuse the saved admin/worker tokens when the database still knows them."""
    from tuner_service import auth
    from tuner_service.db.engine import Database

    path: Path = settings.client_file
    saved: dict[str, str] = {}
    if path.exists():
        with contextlib.suppress(ValueError):
            saved = json.loads(path.read_text())
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            tokens = {}
            for key, role in (("token", "admin"), ("worker_token", "worker")):
                secret = saved.get(key)
                if not secret or auth.authenticate(session, secret) is None:
                    secret = auth.create_token(session, role, f"tuner up ({role})")[1]
                tokens[key] = secret
    finally:
        db.dispose()
    return tokens


def _save_client_file(settings: Any, server_url: str, tokens: dict[str, str]) -> None:
    path: Path = settings.client_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"server_url": server_url, **tokens}, indent=2))
    path.chmod(0o600)


@contextlib.contextmanager
def _server_thread(settings: Any) -> Iterator[str]:
    import uvicorn

    from tuner_service.api import create_app

    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port,
                            log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start; see the log above")
        time.sleep(0.05)
    try:
        yield f"http://{settings.host}:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(15)


@contextlib.contextmanager
def _worker_process(server_url: str, token: str, threads: int | None, log_path: Path
                    ) -> Iterator[subprocess.Popen[bytes] | None]:
    try:
        import tuner_service.cli.worker  # noqa: F401
    except ImportError:
        print("warning: `tuner worker` is not installed here; no local worker started",
              file=sys.stderr)
        yield None
        return
    command = [sys.executable, "-m", "tuner_service.cli.main", "worker", "--server", server_url,
               "--token", token, "--device-key", "local", "--target", "llvm"]
    if threads:
        command += ["--threads", str(threads)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _sample_model(name: str) -> bytes:
    try:
        from tuner_service.frontend.samples import build_sample_model
    except ImportError as e:
        raise RuntimeError(f"the ONNX frontend is not installed ({e}); cannot build {name}") from e
    return bytes(build_sample_model(name).SerializeToString())


def _up(args: argparse.Namespace) -> int:
    from tuner_service.db.migrate import upgrade

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    threads = args.threads or os.cpu_count() or 1
    base = _settings(args, data_dir=args.data_dir, host="127.0.0.1")
    settings = base.with_overrides(port=_free_port(base.host, args.port))
    upgrade(settings.resolved_database_url)
    tokens = _embedded_tokens(settings)
    try:
        model = _sample_model(args.model)
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    with _server_thread(settings) as url:
        _save_client_file(settings, url, tokens)
        print(f"server on {url} (database {settings.resolved_database_url})")
        log_path = settings.data_dir / "worker.log"
        with _worker_process(url, tokens["worker_token"], threads, log_path) as worker:
            if worker is None and not args.no_wait:
                print("error: no worker to measure with; start one with `tuner worker`",
                      file=sys.stderr)
                return 1
            print(f"local worker log: {log_path}")
            code = _run_sample_job(args, url, tokens["token"], model, threads)
        if code == 0 and args.serve:
            print("serving until Ctrl-C")
            _serve_forever()
    return code


def _run_sample_job(args: argparse.Namespace, url: str, token: str, model: bytes,
                    threads: int) -> int:
    """Upload the sample, tune it, show progress; with --no-wait serve until Ctrl-C instead."""
    from tuner_service.cli.client import ClientError, ServiceClient, wait_for

    client = ServiceClient(url, token)
    try:
        uploaded = client.upload_model(model, f"{args.model}.onnx")
        job_id = client.create_job(
            model_id=uploaded["model_id"], target="llvm", device_key="local",
            trials_per_task=args.trials_per_task, tuner=args.tuner, threads=threads)
        print(f"job {job_id}: {args.model}, {len(uploaded['tasks'])} tasks, "
              f"{args.trials_per_task} trials each")
        if args.no_wait:
            print(f"dashboard: {url}/  (Ctrl-C to stop)")
            _serve_forever()
            return 0
        final = wait_for(client, job_id)
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"\ndashboard: {url}/   configs: tuner fetch {job_id} --server {url}")
    return 0 if final["status"] == "done" else 1


def _serve_forever() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser("serve", help="run the tuning server")
    serve.add_argument("--host", default=None, help="default 127.0.0.1 (TUNER_HOST)")
    serve.add_argument("--port", type=int, default=None, help="default 8000 (TUNER_PORT)")
    serve.add_argument("--database", default=None, help="database URL (TUNER_DATABASE_URL)")
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
    create.add_argument("--database", default=None)
    create.set_defaults(func=_token_create)

    _register_up(subparsers)


def _register_up(subparsers: Any) -> None:
    up = subparsers.add_parser("up", help="one machine: server + local worker + sample model")
    up.add_argument("--trials-per-task", type=int, default=16)
    up.add_argument("--model", default="resnet18", help="a sample model name")
    up.add_argument("--tuner", default="xgb-transfer")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--threads", type=int, default=None,
                    help="threads per measurement (default: all cores)")
    up.add_argument("--data-dir", type=Path, default=None)
    up.add_argument("--database", default=None, help="default: SQLite in the data dir")
    up.add_argument("--no-wait", action="store_true", help="submit, then serve until Ctrl-C")
    up.add_argument("--serve", action="store_true", help="keep serving after the job ends")
    up.set_defaults(func=_up)
