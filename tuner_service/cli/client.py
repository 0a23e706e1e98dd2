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

from tuner_service.cli.models import add_input_shape_flag

logger = logging.getLogger(__name__)

DEFAULT_SERVER = "http://127.0.0.1:8000"
FINAL = ("done", "failed", "cancelled")


class ClientError(Exception):
    """A request the server refused or could not be reached for; the message says which."""


class ServiceClient:
    def __init__(self, server: str, token: str | None, timeout_s: float = 120.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server + "/api/v1", headers=headers,
                                  timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            answer = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise ClientError(f"cannot reach the server at {self.server}: {e}") from e
        if answer.status_code >= 400:
            try:
                detail = answer.json().get("detail", answer.text)
            except ValueError:
                detail = answer.text
            raise ClientError(f"HTTP {answer.status_code}: {detail}")
        if answer.headers.get("content-type", "").startswith("application/json"):
            return answer.json()
        return answer.text

    def upload_model(self, data: bytes, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", "/models", files={"file": (name, data, "application/octet-stream")})
        return result

    def create_job(self, **fields: Any) -> int:
        body = {k: v for k, v in fields.items() if v is not None}
        return int(self.request("POST", "/jobs", json=body)["job_id"])

    def job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/jobs/{job_id}")
        return result


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


def render_progress(status: dict[str, Any]) -> Any:
    """A rich table of per-task progress (or plain text without rich)."""
    try:
        from rich.table import Table
    except ImportError:
        return plain_progress(status)
    table = Table(title=f"job {status['job_id']}: {status['status']} ({status['target']})")
    for column in ("task", "workload", "weight", "trials", "best GFLOPS", "latency (ms)",
                   "status"):
        if column == "workload":
            table.add_column(column, overflow="fold", ratio=1)
        else:
            table.add_column(column, justify="right", no_wrap=True)
    for task in status["tasks"]:
        gflops, latency = task.get("best_gflops"), task.get("best_latency_s")
        table.add_row(
            str(task["task_id"]), task["workload"], str(task["weight"]),
            f"{task['trials_done']}/{task['trials_budget']}",
            f"{gflops:.1f}" if gflops else "-", f"{latency * 1e3:.3f}" if latency else "-",
            task["status"])
    return table


def plain_progress(status: dict[str, Any]) -> str:
    lines = [f"job {status['job_id']}: {status['status']}"]
    for task in status["tasks"]:
        gflops = task.get("best_gflops")
        lines.append(f"  {task['task_id']:>5} {task['workload']:<60} "
                     f"{task['trials_done']:>5}/{task['trials_budget']:<5} "
                     f"{(f'{gflops:.1f}' if gflops else '-'):>9} GFLOPS  {task['status']}")
    return "\n".join(lines)


def print_status(status: dict[str, Any]) -> None:
    try:
        from rich.console import Console
    except ImportError:
        print(plain_progress(status))
        return
    Console().print(render_progress(status))


def wait_for(client: ServiceClient, job_id: int, interval_s: float = 1.0) -> dict[str, Any]:
    """Show live per-task progress until the job ends; returns the final status."""
    status = client.job(job_id)
    try:
        from rich.live import Live
    except ImportError:
        while status["status"] not in FINAL:
            print(plain_progress(status), flush=True)
            time.sleep(interval_s)
            status = client.job(job_id)
        return status
    with Live(render_progress(status), refresh_per_second=4) as live:
        while status["status"] not in FINAL:
            time.sleep(interval_s)
            status = client.job(job_id)
            live.update(render_progress(status))
    return status


def _with_client(args: argparse.Namespace, action: Any) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    server, token = resolve_server(args)
    client = ServiceClient(server, token)
    try:
        return int(action(client) or 0)
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _submit(args: argparse.Namespace) -> int:
    path = Path(args.model)
    if not path.is_file():
        print(f"error: no such file {path}", file=sys.stderr)
        return 1

    try:
        data, name = _upload_payload(path)
    except ValueError as e:  # the frontend's ModelError
        print(f"error: {e}", file=sys.stderr)
        return 2

    def action(client: ServiceClient) -> int:
        shapes = {"input_shape": args.input_shape} if args.input_shape else None
        model = client.request("POST", "/models", data=shapes,
                               files={"file": (name, data, "application/octet-stream")})
        for item in model["unsupported"]:
            print(f"unsupported: {item['op']} ({item['node']}): {item['reason']}")
        job_id = client.create_job(model_id=model["model_id"], target=args.target,
                                   device_key=args.device_key,
                                   trials_per_task=args.trials_per_task, tuner=args.tuner)
        print(f"job {job_id}: {len(model['tasks'])} tasks submitted to {client.server}")
        if args.wait:
            status = wait_for(client, job_id)
            return 0 if status["status"] == "done" else 1
        return 0

    return _with_client(args, action)


def _upload_payload(path: Path) -> tuple[bytes, str]:
    """The model's bytes, or a zip of it and its external data files (which the server
    accepts as one model); without onnx installed, the file as it is."""
    try:
        from tuner_service.frontend.archive import model_upload
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

    return _with_client(args, action)


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

    return _with_client(args, action)


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
