"""The Python API: tune a model, build it with its tuned kernels, load and run it.

Everything here is re-exported by ``tuner_service`` (lazily: ``import tuner_service`` stays
light)::

    import tuner_service as tuner

    result = tuner.tune("model.onnx", "model-tuned", trials_per_task=16)
    library = tuner.build("model.onnx", result.configs, "model-tuned/lib")
    model = tuner.load(library, "model.onnx")
    outputs = model.run(model.random_inputs())

``tune`` runs an ordinary job on an embedded SQLite server with local workers (rerun it to
resume); ``Client`` submits to a shared server instead and returns a ``Job`` handle.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuner_service.tuning.embedded import LocalWorkers
from tuner_service.tuning.model_job import TuneError, TuneOptions, TuneResult, read_model
from tuner_service.tuning.remote import (
    ClientError,
    Job,
    JobProgress,
    ServiceClient,
    TaskProgress,
    host_int8,
)

logger = logging.getLogger(__name__)

__all__ = ["Client", "ClientError", "Job", "JobProgress", "LoadedModel", "TaskProgress",
           "TuneError", "TuneResult", "build", "load", "tune"]


def tune(model: str | Path | bytes, output: str | Path, *, trials_per_task: int = 64,
         tuner: str = "xgb-transfer", threads: int | None = None, workers: int = 1,
         parallel_build: int | None = None,
         on_progress: Callable[[JobProgress], None] | None = None,
         push: tuple[str, str | None] | None = None, layout: str = "auto") -> TuneResult:
    """Tune every tunable layer of an ONNX model on this machine's CPU.

    ``output`` receives the tuning log (``tuner.db``), ``configs.json`` and ``records.jsonl``;
    calling again with the same arguments resumes an unfinished job or reuses a finished one.
    ``threads`` is the thread count kernels are timed (and should later run) with, default all
    cores. ``push=(url, token)`` imports the records into a shared server afterwards.
    ``layout``: the library layout to tune for, as ``tuner tune --layout`` (``nchw``,
    ``nchwc`` or ``auto``: both plans' tasks, the default).
    """
    cores = os.cpu_count() or 1
    options = TuneOptions(
        trials_per_task=trials_per_task, tuner=tuner, threads=threads or cores, push=push,
        layout=layout, workers=LocalWorkers(count=workers, threads=threads,
                             parallel_build=parallel_build or cores))
    from tuner_service.tuning.model_job import tune_model

    return tune_model(model, output, options, on_progress=on_progress)


def build(model: str | Path | bytes, configs: str | Path | None, output: str | Path, *,
          threads: int | None = None, layout: str = "auto", precision: str = "fp32") -> Path:
    """Compile every tunable layer with its best config from ``configs`` (``configs.json``
    of ``tune``, ``tuner fetch`` JSON or records; None: template defaults) into
    ``output/libmodel.so`` plus ``output/manifest.json``; returns ``output``. ``threads``:
    the library's default run count (default: the count the configs were tuned at).
    ``layout``: ``nchw``, ``nchwc`` (blocked activations between conv layers) or ``auto``
    (the default: both built and timed once here, the faster kept), as ``tuner build
    --layout``; ``precision``: ``fp32`` or ``bf16``, as ``tuner build --precision``."""
    from tuner_service.compiler.deploy.configs import ConfigBook, load_configs_file
    from tuner_service.compiler.deploy.layout_choice import build_with_layout

    data, _ = read_model(model)
    book = load_configs_file(Path(configs)) if configs is not None else ConfigBook(target="llvm")
    build_with_layout(data, book, Path(output), "llvm", threads, layout=layout,
                      precision=precision)
    return Path(output)


class LoadedModel:
    """A model bound to a built kernel library: ``run(inputs) -> outputs``."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    @property
    def inputs(self) -> dict[str, tuple[int, ...] | None]:
        """Input names and their static shapes (None where a dimension is dynamic)."""
        return dict(self._runner.inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self._runner.outputs)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Outputs by name for float32 arrays by input name."""
        return dict(self._runner.run(inputs))

    def random_inputs(self, seed: int = 0) -> dict[str, Any]:
        return dict(self._runner.random_feeds(seed))

    def benchmark(self, inputs: Mapping[str, Any] | None = None, iterations: int = 20
                  ) -> dict[str, float]:
        """Median/p90/mean/min seconds per inference over ``iterations`` runs."""
        from tuner_service.compiler.deploy.timing import time_runs

        feeds = dict(inputs) if inputs is not None else self.random_inputs()
        return time_runs(lambda: self._runner.run(feeds), iterations)


def load(library: str | Path, model: str | Path | bytes, *, threads: int | None = None
         ) -> LoadedModel:
    """Bind ``model`` to the library ``build`` wrote (kernel threads: the build's count)."""
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.loader import KernelLibrary, read_manifest

    directory = Path(library)
    count = threads or int(read_manifest(directory).get("threads", 1))
    os.environ.setdefault("OMP_NUM_THREADS", str(count))  # before libgomp is loaded
    data, _ = read_model(model)
    return LoadedModel(ModelRunner(data, KernelLibrary(directory), count))


class Client:
    """A shared tuning server: submit models, follow jobs, fetch configs.

    ``with Client("https://tuner.example", token) as client: job = client.submit(...)``"""

    def __init__(self, server: str, token: str | None = None, timeout_s: float = 120.0) -> None:
        self._http = ServiceClient(server, token, timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def submit(self, model: str | Path | bytes, *, trials_per_task: int = 64,
               tuner: str = "xgb-transfer", target: str = "llvm",
               device_key: str | None = None, threads: int | None = None) -> Job:
        """Upload the model and start a job; returns its handle at once."""
        data, name = read_model(model)
        uploaded = self._http.upload_model(data, name, int8=host_int8(target))
        job_id = self._http.create_job(model_id=uploaded["model_id"], target=target,
                                       device_key=device_key, trials_per_task=trials_per_task,
                                       tuner=tuner, threads=threads)
        return Job(self._http, job_id)

    def job(self, job_id: int) -> Job:
        return Job(self._http, job_id)

    def records(self, workload: str | None = None, target: str | None = None) -> str:
        """Measurement records of the shared log as JSON lines."""
        params = {k: v for k, v in (("workload", workload), ("target", target)) if v}
        return str(self._http.request("GET", "/records", params=params))

    def push_records(self, lines: str) -> dict[str, Any]:
        return self._http.push_records(lines)
