"""``tuner submit``, ``tuner status``, ``tuner fetch``: the service's CLI over HTTP (httpx).

The server URL and token come from ``--server``/``--token``, else ``TUNER_SERVER_URL`` /
``TUNER_TOKEN``, else the file ``tuner up`` saves in the data directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from tuner_service.cli import tables
from tuner_service.cli.models import add_input_shape_flag, add_layout_flags
from tuner_service.db.states import JOB_FINAL, JobStatus
from tuner_service.tuning.remote import (
    DEFAULT_SERVER,
    ClientError,
    JobProgress,
    ServiceClient,
    host_int8,
)

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_SERVER", "ClientError", "ServiceClient", "resolve_server",
           "wait_for", "with_client"]


def resolve_server(args: argparse.Namespace) -> tuple[str, str | None]:
    """(server URL, token) from flags, then settings (environment), then the saved file."""
    from tuner_service.settings import get_settings

    settings = get_settings()
    saved: dict[str, Any] = {}
    if settings.client_file.exists():
        try:
            saved = json.loads(settings.client_file.read_text())
        except ValueError:
            logger.warning("ignoring unreadable %s", settings.client_file)
    server = args.server or settings.server_url or saved.get("server_url") or DEFAULT_SERVER
    env_token = settings.token.get_secret_value() if settings.token else None
    return server, args.token or env_token or saved.get("token")


def print_status(status: dict[str, Any]) -> None:
    progress = JobProgress.from_json(status)
    if tables.interactive():
        from rich.console import Console

        Console().print(tables.rich_table(progress))
    else:
        print(tables.plain_table(progress))


def wait_for(client: ServiceClient, job_id: int, interval_s: float = 1.0) -> dict[str, Any]:
    """Show live per-task progress until the job ends; returns the final status.

    On a terminal the table redraws in place; redirected, one summary line is printed when the
    trial count or the job's health changes (at most every 10 s), then the final table."""
    status = client.job(job_id)
    if tables.interactive():
        from rich.live import Live

        with Live(tables.rich_table(JobProgress.from_json(status)), refresh_per_second=4) as live:
            while status["status"] not in JOB_FINAL:
                time.sleep(interval_s)
                status = client.job(job_id)
                live.update(tables.rich_table(JobProgress.from_json(status)))
        return status
    last: tuple[int, str | None] | None = None
    printed = 0.0
    while status["status"] not in JOB_FINAL:
        progress = JobProgress.from_json(status)
        seen = (progress.trials_done, progress.health)
        if last is None or (seen != last and time.monotonic() - printed >= 10):
            print(f"{tables.title(progress)}: {progress.trials_done}/{progress.trials_budget} "
                  f"trials" + (f" (note: {progress.health})" if progress.health else ""),
                  flush=True)
            last, printed = seen, time.monotonic()
        time.sleep(interval_s)
        status = client.job(job_id)
    print(tables.plain_table(JobProgress.from_json(status)), flush=True)
    return status


def with_client(args: argparse.Namespace, action: Any) -> int:
    """``action(client)``'s exit code, or 1 after printing why the server refused."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    try:
        with ServiceClient(*resolve_server(args)) as client:
            return int(action(client) or 0)
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _submit(args: argparse.Namespace) -> int:
    path = Path(args.model)
    if not path.is_file():
        print(f"error: no such file {path}", file=sys.stderr)
        return 2

    try:
        data, name = _upload_payload(path)
    except ValueError as e:  # the frontend's ModelError
        print(f"error: {e}", file=sys.stderr)
        return 2

    def action(client: ServiceClient) -> int:
        form: dict[str, Any] = {"input_shape": args.input_shape} if args.input_shape else {}
        if args.layout != "nchw":
            form.update(layout=args.layout, block=str(args.block or _host_block()))
        if (arithmetic := host_int8(args.target)) != "exact":  # a library built here
            form.update(int8=arithmetic)
        model = client.request("POST", "/models", data=form or None,
                               files={"file": (name, data, "application/octet-stream")})
        for item in model["unsupported"]:
            print(f"unsupported: {item['op']} ({item['node']}): {item['reason']}")
        job_id = client.create_job(model_id=model["model_id"], target=args.target,
                                   device_key=args.device_key,
                                   trials_per_task=args.trials_per_task, tuner=args.tuner)
        print(f"job {job_id}: {len(model['tasks'])} tasks submitted to {client.server}")
        if args.wait:
            status = wait_for(client, job_id)
            return 0 if status["status"] == JobStatus.DONE else 1
        return 0

    return with_client(args, action)


def _host_block() -> int:
    from tuner_service.compiler.deploy.layout import host_block

    return host_block()


def _upload_payload(path: Path) -> tuple[bytes, str]:
    """The model's bytes, or a zip of it and its external data files (which the server
    accepts as one model); without onnx installed, the file as it is."""
    try:
        from tuner_service.compiler.frontend.archive import model_upload
    except ImportError:
        return path.read_bytes(), path.name
    return model_upload(path)


def _status(args: argparse.Namespace) -> int:
    def action(client: ServiceClient) -> int:
        status = client.job(args.job)
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            print_status(status)
        return 0

    return with_client(args, action)


def _fetch(args: argparse.Namespace) -> int:
    def action(client: ServiceClient) -> int:
        params = {"format": args.format}
        body = client.request("GET", f"/jobs/{args.job}/configs", params=params)
        text = body if isinstance(body, str) else json.dumps(body, indent=2) + "\n"
        if args.output:
            Path(args.output).write_text(text)
            print(f"wrote {args.output}")
        else:
            sys.stdout.write(text)
        return 0

    return with_client(args, action)


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help=f"server URL (default: saved or {DEFAULT_SERVER})")
    parser.add_argument("--token", help="bearer token (default: TUNER_TOKEN or saved)")


def register(subparsers: Any) -> None:
    submit = subparsers.add_parser("submit", help="upload a model and start a tuning job")
    submit.add_argument("model", help="an ONNX file")
    submit.add_argument("--target", default="llvm")
    submit.add_argument("--device-key", default=None)
    submit.add_argument("--trials-per-task", type=int, default=64)
    submit.add_argument("--tuner", default="xgb-transfer")
    submit.add_argument("--wait", action="store_true", help="show live progress until done")
    add_input_shape_flag(submit)
    add_layout_flags(submit, "tune the tasks of")
    _connection_flags(submit)
    submit.set_defaults(func=_submit)

    status = subparsers.add_parser("status", help="show a job's per-task progress")
    status.add_argument("job", type=int)
    status.add_argument("--json", action="store_true")
    _connection_flags(status)
    status.set_defaults(func=_status)

    fetch = subparsers.add_parser("fetch", help="download a job's best configs")
    fetch.add_argument("job", type=int)
    fetch.add_argument("-o", "--output", help="write to FILE instead of stdout")
    fetch.add_argument("--format", choices=("json", "autotvm"), default="json")
    _connection_flags(fetch)
    fetch.set_defaults(func=_fetch)
