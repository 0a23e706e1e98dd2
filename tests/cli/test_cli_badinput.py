"""Every mistake a user can make on the command line is one line on stderr, exit code 2, and no
traceback: a table of bad invocations, each run as a shell would run it."""

from __future__ import annotations

import importlib.util
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.cli.conftest import TUNER, run_tuner, write_small_model

# (arguments, a phrase the one line must contain); MODEL and BAD are files the test writes
CASES: list[tuple[list[str], str]] = [
    ([], "required: COMMAND"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["--log-format", "xml", "space", "dense:M=8,N=8,K=8"], "--log-format"),
    (["space", "conv2d:N=1"], "missing parameter"),
    (["space", "nosuch:M=1"], "nosuch"),
    (["codegen", "dense:M=64,N=64,K=64", "--config-index", "1234"], "filtered out"),
    (["codegen", "dense:M=64,N=64,K=64", "--config-index", "-1"], "outside"),
    (["codegen", "dense:M=64,N=64,K=64", "--config", "{bad"], "--config is not JSON"),
    (["codegen", "dense:M=64,N=64,K=64", "--config-index", "x"], "invalid int value"),
    (["tune", "missing.onnx"], "no such file"),
    (["tune", "BAD"], "not an ONNX model"),
    (["tune", "MODEL", "--tuner", "nosuch"], "unknown tuner"),
    (["tune", "MODEL", "--target", "cuda"], "target llvm"),
    (["tune", "MODEL", "--workers", "0"], "at least 1"),
    (["tune", "dense:M=8", "--trials", "2"], "missing parameter"),
    (["tune", "dense:M=8,N=8,K=8", "--trials", "0"], "at least 1"),
    (["extract", "missing.onnx"], "no such file"),
    (["build", "missing.onnx", "-o", "out"], "no such file"),
    (["submit", "missing.onnx"], "no such file"),
    (["sample-model", "vgg16", "-o", "x.onnx"], "invalid choice: 'vgg16'"),
    (["up", "--model", "nosuch"], "neither an ONNX file nor a sample model"),
    (["db", "upgrade", "--database", "mysql://user:secret@db/tuner"], "unsupported database"),
    (["db", "upgrade", "--database", "postgresql://u@127.0.0.1:1/db"], "database error"),
    (["serve", "--database", "mysql://user@db/tuner"], "unsupported database"),
    (["token", "create", "--role", "admin", "--database", "oracle://x"], "unsupported database"),
    (["worker", "--device-key", "x"], "--server and --token"),
    (["worker", "--server", "http://127.0.0.1:9", "--token", "t", "--device-key", "x",
      "--backend-option", "nokey"], "KEY=VALUE"),
]
if importlib.util.find_spec("pycuda") is None:
    CASES.append((["measure", "dense:M=8,N=8,K=8", "--target", "cuda"],
                  "needs pycuda"))


def _materialize(args: list[str], tmp_path: Path) -> list[str]:
    files = {"MODEL": str(tmp_path / "model.onnx"), "BAD": str(tmp_path / "bad.onnx")}
    return [files.get(a, a) for a in args]


@pytest.mark.slow
def test_bad_invocations_are_one_line_with_exit_code_2(tmp_path: Path) -> None:
    write_small_model(tmp_path / "model.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    # the cases are independent: run a few at once (each is a Python start-up)
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda case: run_tuner(_materialize(case[0], tmp_path), tmp_path,
                                                    timeout=300), CASES))
    problems = []
    for (args, phrase), result in zip(CASES, done, strict=True):
        lines = result.stderr.strip().splitlines()
        if result.returncode != 2 or len(lines) != 1 or phrase.lower() not in lines[0].lower() \
                or "Traceback" in result.stderr or "secret" in result.stderr:
            problems.append(f"tuner {' '.join(args)}: exit {result.returncode}, "
                            f"stderr {result.stderr!r}")
    assert not problems, "\n".join(problems)


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``tuner codegen ... | head -1``: the reader leaves early; no BrokenPipeError report."""
    process = subprocess.Popen([*TUNER, "codegen", "dense:M=256,N=256,K=256"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(120)
    assert first.startswith("; ModuleID")
    assert stderr == ""
    assert process.returncode in (0, 141)
