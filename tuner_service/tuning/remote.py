"""A tuning server over HTTP: the typed client behind ``tuner submit``/``status``/``fetch`` and
the Python API (``tuner_service.Client``), and a handle on one job (progress, wait, results).

Only httpx is needed, imported when a client is made.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tuner_service.compiler.frontend.layout_plans import plan_indices
from tuner_service.db.states import JOB_FINAL, TaskStatus
from tuner_service.errors import TunerServiceError

logger = logging.getLogger(__name__)

DEFAULT_SERVER = "http://127.0.0.1:8000"


class ClientError(TunerServiceError):
    """A request the server refused or could not be reached for; the message says which."""


@dataclasses.dataclass(frozen=True)
class TaskProgress:
    task_id: int
    workload: str
    weight: int
    trials_done: int
    trials_budget: int
    best_gflops: float | None
    best_latency_s: float | None
    status: str
    message: str = ""


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """One snapshot of a job: its state, per-task progress, and why it is stuck (if it is)."""

    job_id: int
    status: str
    message: str
    tasks: tuple[TaskProgress, ...]
    #: set while an active job makes no progress: no worker online, or every result failing
    health: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in JOB_FINAL

    @property
    def trials_done(self) -> int:
        return sum(t.trials_done for t in self.tasks)

    @property
    def trials_budget(self) -> int:
        return sum(t.trials_budget for t in self.tasks)

    @property
    def estimated_latency_s(self) -> float | None:
        """Sum of weight x best latency over the tasks of one library; None until every
        tunable task has one. A job with both layouts' tasks (``tuner tune --layout auto``)
        counts each layer once: the faster plan's sum (``layout_plans``)."""
        tuned = [t for t in self.tasks if t.status != TaskStatus.SKIPPED]
        if not tuned or any(t.best_latency_s is None for t in tuned):
            return None
        return min(sum(t.weight * (t.best_latency_s or 0.0) for t in plan)
                   for plan in layout_plans(tuned))

    @classmethod
    def from_json(cls, status: dict[str, Any]) -> JobProgress:
        fields = {f.name for f in dataclasses.fields(TaskProgress)}
        tasks = tuple(TaskProgress(**{k: v for k, v in t.items() if k in fields})
                      for t in status.get("tasks", []))
        health = status.get("health")
        return cls(int(status["job_id"]), str(status["status"]), str(status.get("message", "")),
                   tasks, health.get("message") if isinstance(health, dict) else None)


def layout_plans(tasks: Sequence[TaskProgress]) -> list[list[TaskProgress]]:
    """The tasks of each library plan that ``tasks`` cover: one plan, or, where the tasks are
    both layouts' (a plain conv task and its blocked twin), the plain plan and the blocked one
    (``frontend.layout_plans``)."""
    return [[tasks[i] for i in plan] for plan in plan_indices([t.workload for t in tasks])]


class ServiceClient:
    def __init__(self, server: str, token: str | None, timeout_s: float = 120.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server + "/api/v1", headers=headers,
                                  timeout=timeout_s)

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def upload_model(self, data: bytes, name: str, layout: str = "nchw",
                     block: int | None = None, int8: str = "exact") -> dict[str, Any]:
        """Upload a model; ``layout``/``block``: extract the tasks of that library layout;
        ``int8``: the arithmetic of its int8 layers (``host_int8`` for a CPU library built
        here)."""
        form = {} if layout == "nchw" else {"layout": layout, "block": str(block)}
        if int8 != "exact":
            form["int8"] = int8
        result: dict[str, Any] = self.request(
            "POST", "/models", files={"file": (name, data, "application/octet-stream")},
            data=form)
        return result

    def create_job(self, **fields: Any) -> int:
        body = {k: v for k, v in fields.items() if v is not None}
        return int(self.request("POST", "/jobs", json=body)["job_id"])

    def job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/jobs/{job_id}")
        return result

    def push_records(self, lines: str) -> dict[str, Any]:
        """Import measurement records (JSON lines) into the server's shared tuning log."""
        result: dict[str, Any] = self.request(
            "POST", "/records", content=lines.encode(),
            headers={"Content-Type": "application/x-ndjson"})
        return result


class Job:
    """A handle on one tuning job of a server: progress, wait, best configs, cancel."""

    def __init__(self, client: ServiceClient, job_id: int) -> None:
        self.client, self.id = client, job_id

    def __repr__(self) -> str:
        return f"Job({self.id} on {self.client.server})"

    def progress(self) -> JobProgress:
        return JobProgress.from_json(self.client.job(self.id))

    def wait(self, timeout_s: float | None = None, interval_s: float = 1.0,
             on_progress: Callable[[JobProgress], None] | None = None) -> JobProgress:
        """Poll until the job ends (or ``timeout_s`` passes); returns the last snapshot."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            snapshot = self.progress()
            if on_progress is not None:
                on_progress(snapshot)
            if snapshot.finished or (deadline is not None and time.monotonic() >= deadline):
                return snapshot
            time.sleep(interval_s)

    def configs(self) -> dict[str, Any]:
        """The best config of every task (the JSON ``tuner build --configs`` reads)."""
        result: dict[str, Any] = self.client.request("GET", f"/jobs/{self.id}/configs")
        return result

    def save_configs(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.configs(), indent=2) + "\n")
        return path

    def cancel(self) -> None:
        self.client.request("POST", f"/jobs/{self.id}/cancel")


def host_int8(target: str = "llvm") -> str:
    """The int8 arithmetic of a library built on this machine for ``target`` (``tuner build
    --int8 auto``: onnxruntime's on this CPU; CUDA kernels sum exactly)."""
    if not target.startswith("llvm"):
        return "exact"
    try:
        from tuner_service.compiler.frontend.int8_arithmetic import resolve_int8
    except ImportError:  # a client without the compiler: the server's default
        return "exact"
    return resolve_int8("auto")
