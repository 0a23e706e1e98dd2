"""A worker runs without the server's dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_ONLY = ("fastapi", "sqlalchemy", "xgboost", "pydantic_settings", "alembic", "uvicorn")

PROBE = """
import json, sys
import workers.agent, workers.measure.pool, workers.backends.fake, workers.backends.llvm
import tuner_service.cli.main as main
parser = main.build_parser()
parser.parse_args(["worker", "--server", "http://x", "--token", "t", "--device-key", "k"])
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_running_the_worker_imports_no_server_dependency() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=60)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "workers" in loaded
    assert loaded.isdisjoint(SERVER_ONLY), sorted(loaded & set(SERVER_ONLY))
