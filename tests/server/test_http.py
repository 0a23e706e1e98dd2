"""End to end over real HTTP: uvicorn on a loopback port, the CLI client, a fake worker."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tuner_service.settings import Settings

from .fakes import FakeWorker


@pytest.fixture
def live_server(settings: Settings) -> Iterator[str]:
    import uvicorn

    from tuner_service.app import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.mark.slow
def test_submit_status_fetch_over_http(live_server: str, tokens: dict[str, str],
                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    from tuner_service.cli.main import main
    from tuner_service.compiler.frontend.samples import build_sample_model

    model = tmp_path / "mobilenet.onnx"
    model.write_bytes(build_sample_model("mobilenet_v2").SerializeToString())
    flags = ["--server", live_server, "--token", tokens["user"]]
    assert main(["submit", str(model), "--target", "llvm", "--trials-per-task", "2",
                 *flags]) == 0
    job_id = int(capsys.readouterr().out.split()[1].rstrip(":"))

    with httpx.Client(base_url=live_server) as http:
        status = FakeWorker(http, tokens["worker"]).run_until_done(job_id)
    assert status["status"] == "done"

    assert main(["status", str(job_id), "--json", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "done"
    out = tmp_path / "configs.json"
    assert main(["fetch", str(job_id), "-o", str(out), *flags]) == 0
    assert "wrote" in capsys.readouterr().out
    assert all(t["config"] for t in json.loads(out.read_text())["tasks"]
               if t["status"] == "done")
    assert main(["fetch", str(job_id), "--format", "autotvm", *flags]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines and all(r["version"] == 0.2 and r["result"][1] == 0 for r in lines)


def test_cli_reports_server_errors_clearly(live_server: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from tuner_service.cli.main import main

    assert main(["status", "999", "--server", live_server]) == 1
    assert "404" in capsys.readouterr().err
    assert main(["status", "1", "--server", "http://127.0.0.1:9"]) == 1
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.slow
def test_sample_model_tuned_by_a_real_local_worker(
        live_server: str, tokens: dict[str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Upload bert_block, measure on a real `tuner worker` subprocess, fetch both formats."""
    import subprocess
    import sys

    from tuner_service.cli.main import main
    from tuner_service.compiler.frontend.samples import build_sample_model

    model = tmp_path / "bert_block.onnx"
    model.write_bytes(build_sample_model("bert_block").SerializeToString())
    worker = subprocess.Popen(
        [sys.executable, "-m", "tuner_service.cli.main", "worker", "--server", live_server,
         "--token", tokens["worker"], "--device-key", "local", "--target", "llvm",
         "--poll-s", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        flags = ["--server", live_server, "--token", tokens["user"]]
        code = main(["submit", str(model), "--device-key", "local", "--trials-per-task", "2",
                     "--wait", *flags])
        assert code == 0, capsys.readouterr()
        job_id = int(capsys.readouterr().out.split("job ")[1].split(":")[0])
        assert main(["fetch", str(job_id), *flags]) == 0
        tasks = json.loads(capsys.readouterr().out)["tasks"]
        assert tasks and all(t["best_gflops"] and t["config"] for t in tasks)
        assert main(["fetch", str(job_id), "--format", "autotvm", *flags]) == 0
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(records) == len(tasks) and all(r["result"][1] == 0 for r in records)
    finally:
        worker.terminate()
        worker.wait(20)


def test_concurrent_workers_over_http_share_without_overlap(live_server: str,
                                                            tokens: dict[str, str]) -> None:
    with httpx.Client(base_url=live_server) as http:
        answer = http.post("/api/v1/jobs", headers={"Authorization": f"Bearer {tokens['user']}"},
                           json={"workloads": ["dense:M=8,N=16,K=32", "dense:M=4,N=32,K=16"],
                                 "trials_per_task": 20})
        job_id = answer.json()["job_id"]
    claimed: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        with httpx.Client(base_url=live_server, timeout=30) as http:
            worker = FakeWorker(http, tokens["worker"])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                items = worker.claim(3, wait_s=0.5)
                if not items:
                    if http.get(f"/api/v1/jobs/{job_id}").json()["status"] == "done":
                        return
                    continue
                with lock:
                    claimed.extend(i["measure_id"] for i in items)
                worker.report(items)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 40 trials, then each task's top configs re-measured before its best is stored
    assert len(claimed) == len(set(claimed)) > 40
    with httpx.Client(base_url=live_server) as http:
        status = http.get(f"/api/v1/jobs/{job_id}").json()
    assert status["status"] == "done"
    assert [t["trials_done"] for t in status["tasks"]] == [20, 20]
