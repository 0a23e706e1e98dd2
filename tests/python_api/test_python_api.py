"""The Python API as users call it: ``import tuner_service as tuner`` stays light, ``build`` and
``load`` run a model against onnxruntime, and ``Client`` follows a job on a server (here one
without workers, which the job's progress says)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tuner_service as tuner
from tests.cli.conftest import write_small_model
from tuner_service.settings import Settings
from tuner_service.tuning.embedded import LocalService, local_service


def test_importing_the_package_loads_no_server_code() -> None:
    # even the API's names resolve without them: they load when a function runs
    code = ("import sys, tuner_service as t\n"
            "heavy = lambda: [m for m in ('fastapi', 'sqlalchemy', 'xgboost', 'onnx', 'httpx') "
            "if m in sys.modules]\n"
            "assert not heavy(), heavy()\n"
            "assert callable(t.tune) and callable(t.Client) and not heavy(), heavy()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert set(tuner.__all__) <= set(dir(tuner))
    with pytest.raises(AttributeError):
        _ = tuner.no_such_name  # type: ignore[attr-defined]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_small_model(tmp_path / "model.onnx")


def test_build_and_load_run_the_model(model: Path, tmp_path: Path) -> None:
    import onnxruntime

    library = tuner.build(model, None, tmp_path / "lib")  # template defaults
    loaded = tuner.load(library, model)
    assert loaded.inputs == {"x": (4, 64)} and loaded.outputs == ["y"]
    inputs = loaded.random_inputs(seed=3)
    got = loaded.run(inputs)["y"]
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = session.run(None, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert loaded.benchmark(inputs, iterations=3)["median_s"] > 0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalService]:
    data = tmp_path / "server"
    settings = Settings(data_dir=data, database_url=f"sqlite:///{data / 'tuner.db'}", port=0)
    with local_service(settings, workers=None) as service:
        yield service


def test_a_client_follows_a_job_and_hears_there_is_no_worker(model: Path,
                                                             server: LocalService) -> None:
    with tuner.Client(server.url, server.token) as client:
        job = client.submit(model, trials_per_task=4, device_key="nowhere")
        progress = job.wait(timeout_s=2, interval_s=0.5)
        assert not progress.finished and progress.trials_done == 0
        assert progress.trials_budget == 8 and len(progress.tasks) == 2
        assert progress.health is not None and "no worker online" in progress.health
        assert "--device-key nowhere" in progress.health
        job.cancel()
        assert client.job(job.id).progress().status == "cancelled"
        assert all(t["config"] is None for t in job.configs()["tasks"])
    with tuner.Client(server.url, "not-a-token") as client, \
            pytest.raises(tuner.ClientError, match="HTTP 401"):
        client.submit(model)


def test_tune_refuses_an_unreadable_model(tmp_path: Path) -> None:
    with pytest.raises(tuner.TuneError, match="no such file"):
        tuner.tune(tmp_path / "missing.onnx", tmp_path / "out", trials_per_task=1)
