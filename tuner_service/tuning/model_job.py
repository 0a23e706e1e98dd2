"""Tune one ONNX model on this machine: ``tuner tune MODEL.onnx`` and ``tuner_service.tune``.

The work is an ordinary job of the embedded service (``tuning/embedded.py``): the model is
uploaded, split into tasks, and tuned by the job driver with local workers, exactly as a shared
server would. The output directory holds the SQLite database, which is the tuning log: running
the same command again resumes an unfinished job from its recorded measurements, and reuses a
finished one with the same settings instead of measuring again.

Output directory::

    tuner.db          the embedded database (every measurement; resumable)
    configs.json      best config per task (``tuner build --configs`` reads it)
    records.jsonl     every measurement as JSON lines (``--records``, ``POST /api/v1/records``)
    worker-N.log      the local workers' logs
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner_service.db.states import JOB_ACTIVE, JobStatus
from tuner_service.errors import TunerServiceError
from tuner_service.tuning.embedded import DEVICE_KEY, LocalWorkers, local_service
from tuner_service.tuning.remote import ClientError, Job, JobProgress, ServiceClient, host_int8

logger = logging.getLogger(__name__)

CONFIGS_FILE = "configs.json"
RECORDS_FILE = "records.jsonl"


class TuneError(TunerServiceError):
    """A model that cannot be tuned here (unreadable, nothing tunable, server refused it)."""


#: a local worker of a model run exits after this long without work (its parent may be gone)
WORKER_IDLE_S = 600.0


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    trials_per_task: int = 64
    tuner: str = "xgb-transfer"
    workers: LocalWorkers = dataclasses.field(default_factory=LocalWorkers)
    #: threads each measured kernel runs with (the count the configs are tuned for)
    threads: int = 1
    port: int = 0
    #: a server (URL, token) to push every record to once the job ends
    push: tuple[str, str | None] | None = None
    #: the library layout to tune for (``tuner build --layout``): ``nchw``, ``nchwc`` (conv
    #: layers as blocked workloads) or ``auto`` (both, the build times both plans)
    layout: str = "auto"


@dataclasses.dataclass(frozen=True)
class TuneResult:
    job_id: int
    output: Path
    configs: Path
    records: Path
    progress: JobProgress
    #: "new", "resumed" (an unfinished job went on) or "reused" (already done: nothing measured)
    origin: str
    unsupported: tuple[str, ...] = ()
    pushed: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.progress.status == JobStatus.DONE


def read_model(model: str | Path | bytes) -> tuple[bytes, str]:
    """What to upload: the bytes and a name (a zip with the model's external data files when
    its tensors live beside it)."""
    if isinstance(model, bytes):
        return model, f"model-{hashlib.sha256(model).hexdigest()[:12]}.onnx"
    path = Path(model)
    if not path.is_file():
        raise TuneError(f"cannot read {path}: no such file")
    from tuner_service.compiler.frontend.archive import model_upload
    from tuner_service.compiler.frontend.errors import ModelError

    try:
        return model_upload(path)
    except ModelError as e:
        raise TuneError(f"cannot read {path}: {e}") from e


def tune_model(model: str | Path | bytes, output: str | Path, options: TuneOptions,
               on_start: Callable[[str, Job, str], None] | None = None,
               on_progress: Callable[[JobProgress], None] | None = None) -> TuneResult:
    """Tune every task of ``model`` with a job on the embedded service in ``output``.

    ``on_start(server_url, job, origin)`` runs once the job exists; ``on_progress`` with every
    snapshot until it ends."""
    data, name = read_model(model)
    output = Path(output)
    settings = _embedded_settings(output, options.port, len(data))
    workers = options.workers
    if workers.max_idle_s is None:
        workers = dataclasses.replace(workers, max_idle_s=WORKER_IDLE_S)
    with local_service(settings, workers) as service, \
            ServiceClient(service.url, service.token) as client:
        try:
            uploaded = client.upload_model(data, name, options.layout, _block(options.layout),
                                           host_int8())
            job_id, origin = _find_or_create(client, uploaded["model_id"], options)
        except ClientError as e:
            raise TuneError(str(e)) from e
        job = Job(client, job_id)
        if on_start is not None:
            on_start(service.url, job, origin)
        final = job.wait(interval_s=1.0, on_progress=on_progress)
        configs = job.save_configs(output / CONFIGS_FILE)
        records = output / RECORDS_FILE
        lines = client.request("GET", "/records", params={"target": "llvm"})
        records.write_text(lines if isinstance(lines, str) else "")
    finished = final.status == JobStatus.DONE
    pushed = _push(options.push, records) if options.push and finished else None
    unsupported = tuple(f"{u['op']} ({u['node']}): {u['reason']}"
                        for u in uploaded.get("unsupported", []))
    return TuneResult(job_id, output, configs, records, final, origin, unsupported, pushed)


def _block(layout: str) -> int | None:
    """The channel block of a blocked layout: this machine's, since local workers measure."""
    if layout == "nchw":
        return None
    from tuner_service.compiler.deploy.layout import host_block

    return host_block()


def _embedded_settings(output: Path, port: int, model_bytes: int = 0) -> Any:
    from tuner_service.settings import get_settings

    settings = get_settings()
    database = f"sqlite:///{(output / 'tuner.db').resolve()}"
    # the embedded database always: TUNER_DATABASE_URL names a shared server's database; the
    # upload limit guards a shared server, not this process's own model (BERT-base is 440 MB)
    return settings.with_overrides(data_dir=output, database_url=database, host="127.0.0.1",
                                   port=port, max_upload_bytes=max(settings.max_upload_bytes,
                                                                   model_bytes + (1 << 20)))


def _find_or_create(client: ServiceClient, model_id: int, options: TuneOptions
                    ) -> tuple[int, str]:
    """The job to run: an unfinished or finished one of this model with the same settings,
    else a new one."""
    same = [j for j in client.request("GET", "/jobs", params={"limit": 1000})
            if j["model_id"] == model_id and j["tuner"] == options.tuner
            and j["trials_per_task"] == options.trials_per_task and j["target"] == "llvm"
            and j["device_key"] == DEVICE_KEY]
    for wanted, origin in ((JOB_ACTIVE, "resumed"), ((JobStatus.DONE,), "reused")):
        match = [j for j in same if j["status"] in wanted]
        if match:
            logger.info("job %d: %s", match[0]["job_id"], origin)
            return int(match[0]["job_id"]), origin
    job_id = client.create_job(model_id=model_id, target="llvm", device_key=DEVICE_KEY,
                               trials_per_task=options.trials_per_task, tuner=options.tuner,
                               threads=options.threads)
    return job_id, "new"


def _push(push: tuple[str, str | None], records: Path) -> dict[str, Any]:
    server, token = push
    try:
        with ServiceClient(server, token) as remote:
            return remote.push_records(records.read_text())
    except ClientError as e:
        raise TuneError(f"tuning finished, but pushing the records to {server} failed: {e} "
                        f"(they are in {records})") from e
