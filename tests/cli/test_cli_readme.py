"""The README's documented commands, run as written (with small budgets): the kernel commands,
"Tune your own model" on a real (small) ONNX model, and the Python API example."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest

from tests.cli.conftest import run_tuner, write_small_model

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(section: str, language: str) -> str:
    """The first ``language`` code block under the heading ``## section``."""
    text = README.read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end >= 0 else None]
    match = re.search(rf"```{language}\n(.*?)```", body, re.S)
    assert match, f"no {language} block under {section!r}"
    return match.group(1)


def commands(block: str) -> list[list[str]]:
    """``tuner`` command lines of a bash block, comments dropped, budgets made small."""
    out = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "tuner":
            small = " ".join(words[1:])
            small = re.sub(r"--trials \d+", "--trials 2", small)
            out.append(shlex.split(small))
    return out


def test_the_readme_documents_these_commands() -> None:
    kernels = commands(readme_block("Kernels without a server", "bash"))
    assert [c[0] for c in kernels] == ["space", "codegen", "codegen", "measure", "tune"]
    own = commands(readme_block("Tune your own model", "bash"))
    assert [c[0] for c in own] == ["extract", "tune", "build", "run"]


@pytest.mark.slow
def test_kernel_commands_run_as_documented(tmp_path: Path) -> None:
    for args in commands(readme_block("Kernels without a server", "bash")):
        done = run_tuner(args, tmp_path)
        assert done.returncode == 0, f"tuner {' '.join(args)}: {done.stderr}"
        assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_tune_your_own_model_then_the_python_api(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_small_model(tmp_path / "model.onnx")
    outputs = []
    for args in commands(readme_block("Tune your own model", "bash")):
        done = run_tuner(args, tmp_path)
        assert done.returncode == 0, f"tuner {' '.join(args)}: {done.stderr}"
        outputs.append(done.stdout)
    assert "tuned configs:" in outputs[1] and "onnxruntime:" in outputs[1]
    assert (tmp_path / "model-tuned" / "configs.json").is_file()
    assert "vs onnxruntime" in outputs[3]

    # the Python example, as written but for the budget: the same job, already done, is reused
    example = re.sub(r"trials_per_task=\d+", "trials_per_task=2",
                     readme_block("Tune your own model", "python"))
    script = tmp_path / "example.py"
    script.write_text(example)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        monkeypatch.undo()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("done ")
    assert printed[1] == "{'y': (4, 16)}"
    assert printed[2].endswith(" ms")
