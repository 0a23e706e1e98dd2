"""``tuner build --server``: configs come from a live server's shared tuning log over HTTP."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_deploy_library import CONV_KEY, tuned_book, two_convs

from tuner_service.settings import Settings


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """uvicorn on a loopback port over a migrated SQLite file, and a token per role."""
    import uvicorn

    from tuner_service import auth
    from tuner_service.app import create_app
    from tuner_service.db.engine import Database
    from tuner_service.db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp_path / "data")
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            tokens = {role: auth.create_token(session, role, f"test-{role}")[1]
                      for role in auth.ROLES}
    finally:
        db.dispose()
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
    yield f"http://127.0.0.1:{port}", tokens
    server.should_exit = True
    thread.join(10)


def test_build_uses_the_servers_tuning_log(live_server: tuple[str, dict[str, str]],
                                           tmp_path: Path) -> None:
    from tuner_service.cli.log import local_device_class
    from tuner_service.cli.main import main

    url, tokens = live_server
    book, index = tuned_book()
    (entry,) = book.entries()
    # measured on this kind of machine: a build here picks it (tests/jobs/test_device_packs.py
    # covers other classes and the fallback levels)
    record = {"workload": entry.workload, "target": "llvm", "template": entry.template,
              "template_version": entry.template_version, "config": entry.config,
              "result": {"costs": [2e-5, 2.2e-5], "error_kind": 0}, "device_key": "test",
              "device_class": local_device_class(), "threads": 1}
    answer = httpx.post(f"{url}/api/v1/records", content=json.dumps(record) + "\n",
                        headers={"Authorization": f"Bearer {tokens['user']}"})
    assert answer.status_code == 200, answer.text
    model = tmp_path / "model.onnx"
    model.write_bytes(two_convs().SerializeToString())
    out = tmp_path / "lib"
    assert main(["build", str(model), "--server", url, "--token", tokens["user"],
                 "-o", str(out), "--layout", "nchw"]) == 0  # the record is of a conv2d
    manifest = json.loads((out / "manifest.json").read_text())
    (kernel,) = manifest["kernels"]
    assert kernel["workload"].startswith(CONV_KEY)
    assert kernel["config_source"] == "tuned" and kernel["config"]["index"] == index
    assert kernel["tuned_latency_s"] == pytest.approx(2.1e-5)


def test_a_jobs_configs_carry_the_thread_count_it_measured_at(
        client: Any, tokens: dict[str, str], tmp_path: Path) -> None:
    from tuner_service.compiler.deploy.configs import load_configs_file

    answer = client.post("/api/v1/jobs", headers={"Authorization": f"Bearer {tokens['user']}"},
                         json={"workloads": [CONV_KEY], "target": "llvm", "threads": 2,
                               "trials_per_task": 2, "tuner": "random"})
    assert answer.status_code == 201, answer.text
    configs = client.get(f"/api/v1/jobs/{answer.json()['job_id']}/configs",
                         headers={"Authorization": f"Bearer {tokens['user']}"})
    assert configs.status_code == 200, configs.text
    assert configs.json()["threads"] == 2
    path = tmp_path / "configs.json"
    path.write_text(configs.text)
    assert load_configs_file(path).threads == 2
