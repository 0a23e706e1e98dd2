"""bench/e2e.py's arithmetic and report on made-up measurements (no model is run, nothing is
timed): ratios against the faster peer, geometric means, the Markdown tables, argument checks."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import e2e
import e2e_report
import e2e_tune


def _row(model: str, kind: str, threads: int, **ms: float | None) -> dict[str, Any]:
    engines = {name: ({"ms": value, "max_rel_error": 1e-6, "kernel_layers": 3,
                       "numpy_steps": 1} if name in ("default", "tuned") else {"ms": value})
               if value is not None else {"error": "not installed"}
               for name, value in ms.items()}
    return {"model": model, "kind": kind, "threads": threads, "engines": engines,
            "ratios": e2e_report.ratios(engines),
            "tuning": {"trials": 24, "wall_s": 16.0}, "libraries": {}}


def test_ratios_are_against_the_faster_peer_that_ran() -> None:
    row = _row("m", "zoo", 1, default=20.0, tuned=10.0, onnxruntime=15.0, openvino=12.0)
    assert row["ratios"]["tuned_vs_best"] == pytest.approx(1.2)
    assert row["ratios"]["default_vs_onnxruntime"] == pytest.approx(0.75)
    only_ort = _row("m", "zoo", 1, default=20.0, tuned=10.0, onnxruntime=15.0, openvino=None)
    assert only_ort["ratios"]["tuned_vs_best"] == pytest.approx(1.5)
    untuned = _row("m", "zoo", 1, default=20.0, tuned=None, onnxruntime=15.0, openvino=None)
    assert untuned["ratios"]["tuned_vs_best"] is None


def test_summary_geomeans_and_wins_per_thread_count_and_group() -> None:
    rows = [_row("a", "zoo", 2, default=10.0, tuned=5.0, onnxruntime=10.0, openvino=20.0),
            _row("b", "zoo", 2, default=10.0, tuned=20.0, onnxruntime=10.0, openvino=10.0),
            _row("c", "sample", 2, default=1.0, tuned=1.0, onnxruntime=2.0, openvino=None)]
    by_kind = {s["kind"]: s for s in e2e_report.summary(rows)}
    assert by_kind["zoo"]["geomean_tuned_vs_best"] == pytest.approx(math.sqrt(2.0 * 0.5))
    assert by_kind["zoo"]["tuned_beats_both"] == 1
    # a row where a peer did not run cannot count as beating both
    assert by_kind["sample"]["tuned_beats_both"] == 0
    assert by_kind["sample"]["geomean_default_vs_onnxruntime"] == pytest.approx(2.0)


def test_each_precision_is_summarized_and_checked_apart() -> None:
    rows = [_row("a", "zoo", 1, default=10.0, tuned=None, onnxruntime=10.0, openvino=10.0),
            _row("a-bf16", "zoo", 1, default=5.0, tuned=None, onnxruntime=10.0, openvino=4.0),
            _row("a-int8", "zoo", 1, default=4.0, tuned=None, onnxruntime=6.0, openvino=8.0),
            _row("a-int8r", "zoo", 1, default=4.0, tuned=None, onnxruntime=4.0, openvino=8.0)]
    by_kind = {s["kind"]: s for s in e2e_report.summary(rows)}
    # 7-bit weights (--reduce-range) are a precision of their own
    assert set(by_kind) == {"zoo", "zoo bf16", "zoo int8", "zoo int8r"}
    assert by_kind["zoo int8r"]["geomean_default_vs_best"] == pytest.approx(1.0)
    assert by_kind["zoo"]["geomean_default_vs_best"] == pytest.approx(1.0)
    assert by_kind["zoo bf16"]["geomean_default_vs_best"] == pytest.approx(0.8)
    assert by_kind["zoo int8"]["geomean_default_vs_best"] == pytest.approx(1.5)
    for row, error in zip(rows, (2e-3, 2e-3, 5e-2, 5e-2), strict=True):
        row["engines"]["default"]["max_rel_error"] = error
    flagged = [line for line in e2e_report.problems(rows) if "relative error" in line]
    # fp32 is held to 1e-4, bf16 to 1e-2, int8 (whole quantization steps) is compared elsewhere
    assert flagged == ["- a @1: default relative error 2.0e-03 above 0.0001"]


def test_markdown_has_a_table_per_thread_count_and_lists_problems(tmp_path: Path) -> None:
    rows = [_row("resnet18", "sample", t, default=10.0, tuned=8.0, onnxruntime=9.0,
                 openvino=None, torch=12.0) for t in (1, 2)]
    report = {"command": "--models resnet18", "exporter": "torchscript", "iterations": 3,
              "tuner": "xgb-transfer", "trials_per_task": 2, "rows": rows,
              "summary": e2e_report.summary(rows),
              "host": {"cpu": "cpu", "cores": 2, "date": "today", "load_average": [0.1],
                       "versions": {"onnxruntime": "1"}}}
    out = tmp_path / "e2e.md"
    e2e_report.write_docs(report, out)
    text = out.read_text()
    assert "## 1 thread" in text and "## 2 threads" in text
    assert "| resnet18 | 10.0 | 8.0 | 9.0 | err | 12.0 | 1.12 |" in text
    assert "openvino failed: `not installed`" in text
    assert "24 / 16" in text


def test_paired_medians_name_our_libraries_and_set_the_ratios(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_call(command: list[str], stage: str) -> tuple[dict[str, Any], str, float]:
        seen.append(command)
        engines = command[3:command.index("--threads")]
        ms = dict(zip(engines, (9.0, 8.0, 10.0, 12.0), strict=False))
        # per-round ratios to the first engine: not the ratios of the medians (the engines'
        # medians fell in different speed phases of the machine)
        ratio = dict(zip(engines, (1.0, 0.9, 1.2, 1.5), strict=False))
        return {"engines": [{"engine": e, "median_ms": ms[e], "ratio_to_first": ratio[e]}
                            for e in engines]}, "", 1.0

    monkeypatch.setattr(e2e, "call", fake_call)
    ours = {"default": tmp_path / "default", "tuned": tmp_path / "tuned-t2"}
    paired = e2e.run_paired("m.onnx", ours, 2, 7)
    assert seen[0][-4:] == ["--threads", "2", "--rounds", "7"]
    assert paired == {"default": 9.0, "tuned": 8.0, "onnxruntime": 10.0, "openvino": 12.0,
                      "rounds": 7, "ratio_to_first": {"default": 1.0, "tuned": 0.9,
                                                      "onnxruntime": 1.2, "openvino": 1.5}}
    # the fresh processes said otherwise (a busy moment): the row's ratios are the paired
    # ones, from the per-round ratios; the table still shows the paired medians
    row = _row("m", "zoo", 2, default=20.0, tuned=8.5, onnxruntime=9.0, openvino=11.0)
    row["paired"] = paired
    row["ratios"] = e2e_report.ratios(e2e.paired_engines(paired))
    assert row["ratios"]["default_vs_best"] == pytest.approx(1.2)
    assert row["ratios"]["tuned_vs_best"] == pytest.approx(1.2 / 0.9)
    assert "| 9.0 / 8.0 / 10.0 / 12.0 | 1.33 | 1.20 |" in "\n".join(e2e_report.table([row], 2))
    # a report from before the per-round ratios were kept: the medians' ratios
    old = {k: v for k, v in paired.items() if k != "ratio_to_first"}
    assert e2e_report.ratios(e2e.paired_engines(old))["default_vs_best"] == \
        pytest.approx(10.0 / 9.0)

    def failing(command: list[str], stage: str) -> tuple[None, str, float]:
        return None, "openvino: no such module", 0.1

    monkeypatch.setattr(e2e, "call", failing)
    row["paired"] = e2e.run_paired("m.onnx", ours, 2, 7)
    assert row["paired"] == {"error": "openvino: no such module"}
    assert any("paired run failed" in line for line in e2e_report.problems([row]))


def test_a_paired_run_leaves_out_the_engines_that_failed_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO fails on a quantized BERT in its own process: the paired run times the rest
    (a peer that cannot load would fail it all), and the row's ratios come from it."""
    seen: list[list[str]] = []

    def fake_call(command: list[str], stage: str) -> tuple[dict[str, Any], str, float]:
        seen.append(command)
        engines = command[3:command.index("--threads")]
        return {"engines": [{"engine": e, "median_ms": 10.0 + i, "ratio_to_first": 1.0 + i}
                            for i, e in enumerate(engines)]}, "", 1.0

    monkeypatch.setattr(e2e, "call", fake_call)
    row = _row("bert_base-int8", "zoo", 1, default=10.0, tuned=None, onnxruntime=30.0,
               openvino=None)
    e2e.pair_row(row, "m.onnx", {"default": tmp_path / "d", "tuned": tmp_path / "t"}, 5)
    assert seen[0][3:seen[0].index("--threads")] == [str(tmp_path / "d"), "onnxruntime"]
    assert row["ratio_source"] == "paired"
    assert row["ratios"]["default_vs_best"] == pytest.approx(2.0)  # not 11 / 10
    assert row["ratios"]["tuned_vs_best"] is None


@pytest.mark.parametrize("argv", [["--trials", "33"], ["--trials", "0"], ["--models", "nope"],
                                  ["--threads", "1,x"], ["--iterations", "0"],
                                  ["--paired", "-1"]])
def test_bad_arguments_are_refused_with_a_message(argv: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        e2e.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_defaults_cover_samples_and_zoo_at_one_and_two_threads() -> None:
    args = e2e.parse_args([])
    assert args.threads == [1, 2] and args.trials == 32 and args.tune
    assert {"resnet18", "mobilenet_v2", "bert_block", "squeezenet1_1"} <= set(args.models)
    assert not e2e.parse_args(["--no-tune"]).tune


def test_tuning_cache_is_keyed_by_model_threads_and_device_class(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e2e_tune, "CACHE", tmp_path)
    slug = e2e_tune.device_slug()
    assert slug.startswith("cpu_") and "/" not in slug and ":" not in slug
    configs, meta = e2e_tune.cache_files("resnet18", 2)
    assert configs.name == f"resnet18-t2-{slug}.json"
    assert e2e_tune.cached("resnet18", 2, None) is None
    configs.parent.mkdir(parents=True)
    configs.write_text("{}")
    meta.write_text('{"trials_per_task": 8, "trials": 96, "wall_s": 40.0, "tasks": 12, '
                    '"tuned_tasks": 12, "job_id": 3}')
    hit = e2e_tune.cached("resnet18", 2, 8)
    assert hit is not None and hit.origin == "cache" and hit.trials == 96
    assert e2e_tune.cached("resnet18", 2, 32) is None  # another budget: tune again
    assert e2e_tune.cached("resnet18", 1, None) is None
    meta.write_text('{"trials_per_task": 8, "trials": 96}')  # an older record: tune again
    assert e2e_tune.cached("resnet18", 2, 8) is None
