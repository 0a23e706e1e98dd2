"""The nightly GitHub Actions workflow: it parses, runs on a schedule and by hand, reads the
server from repository secrets, and its refresh step is a valid ``tuner refresh`` command line
whose export directory is the one it uploads."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml
from ops_compose import ROOT

from tuner_service.cli import refresh
from tuner_service.cli.main import build_parser

WORKFLOW = ROOT / ".github" / "workflows" / "nightly-tune.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the bare key `on` as the boolean true
    found: dict[str, Any] = workflow.get("on", workflow.get(True))
    return found


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    [job] = workflow["jobs"].values()
    found: list[dict[str, Any]] = job["steps"]
    return found


def expand(command: str, env: dict[str, str]) -> list[str]:
    """The step's words after the shell expands "$NAME" from the job's environment."""
    text = re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), command)
    return shlex.split(text)


def test_it_runs_nightly_and_on_demand(workflow: dict[str, Any]) -> None:
    on = triggers(workflow)
    [schedule] = on["schedule"]
    fields = schedule["cron"].split()
    assert len(fields) == 5 and fields[2:] == ["*", "*", "*"]  # every day
    assert "workflow_dispatch" in on
    assert set(on["workflow_dispatch"]["inputs"]) == {"older_than_days", "budget", "tuner"}


def test_the_server_comes_from_secrets(workflow: dict[str, Any]) -> None:
    [job] = workflow["jobs"].values()
    assert job["env"]["TUNER_SERVER_URL"] == "${{ secrets.TUNER_SERVER_URL }}"
    assert job["env"]["TUNER_TOKEN"] == "${{ secrets.TUNER_TOKEN }}"
    assert "secrets." not in " ".join(s.get("run", "") for s in steps(workflow))
    assert workflow["permissions"] == {"contents": "read"}


def test_the_refresh_step_is_a_valid_command_and_its_export_is_uploaded(
        workflow: dict[str, Any]) -> None:
    [job] = workflow["jobs"].values()
    # what the expressions give on the nightly run (no dispatch inputs)
    env = {k: re.sub(r"\$\{\{.*\|\| '([^']*)' \}\}", r"\1", str(v)) for k, v in
           job["env"].items()}
    env.update(TUNER_SERVER_URL="https://tuner.example", TUNER_TOKEN="t")
    [run] = [s["run"] for s in steps(workflow) if "tuner refresh" in s.get("run", "")]
    words = expand(run, env)
    assert words[:2] == ["tuner", "refresh"]
    args = build_parser().parse_args(words[1:])
    assert args.func is refresh._refresh
    assert (args.server, args.older_than, args.budget, args.tuner) == (
        "https://tuner.example", 7.0, 32, "random")
    assert args.token is None  # from TUNER_TOKEN, never on a command line
    assert 0 < args.timeout_s < job["timeout-minutes"] * 60

    [upload] = [s for s in steps(workflow)
                if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload["with"]["path"].rstrip("/") == args.export
    assert upload["if"] == "always()"  # a timed-out run still publishes what it measured


def test_the_project_is_installed_before_it_runs(workflow: dict[str, Any]) -> None:
    runs = [s.get("run", "") for s in steps(workflow)]
    install = next(i for i, r in enumerate(runs) if "pip install" in r)
    refresh_at = next(i for i, r in enumerate(runs) if "tuner refresh" in r)
    assert install < refresh_at and "'.[server]'" in runs[install]
    assert any(str(s.get("uses", "")).startswith("actions/checkout@") for s in steps(workflow))
