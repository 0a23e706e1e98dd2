"""``tuner tune --tuner xgb-transfer --records FILE``: records saved by one run seed the next."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner_service.cli.main import main
from tuner_service.tuners.transfer import parse_records


@pytest.mark.slow
def test_saved_records_feed_a_transfer_run(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "records.jsonl"
    assert main(["tune", "dense:M=32,N=32,K=32", "--trials", "6", "--batch", "3",
                 "--tuner", "ga", "--save-records", str(records), "--json"]) == 0
    capsys.readouterr()
    saved = parse_records(records.read_text().splitlines(), "dense.x86", "llvm", 1)
    assert len(saved) == 6 and any(r.result.ok for r in saved)
    assert main(["tune", "dense:M=32,N=48,K=32", "--trials", "6", "--batch", "3",
                 "--tuner", "xgb-transfer", "--records", str(records), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trials"] == 6 and report["best"]["gflops"] > 0


def test_records_need_a_transfer_tuner(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "records.jsonl"
    records.write_text("")
    assert main(["tune", "dense:M=32,N=32,K=32", "--trials", "2", "--tuner", "random",
                 "--records", str(records)]) == 2
    assert "--records is used by xgb-transfer" in capsys.readouterr().err
    records.write_text('{"no": "record"}\n')
    assert main(["tune", "dense:M=32,N=32,K=32", "--trials", "2", "--tuner", "xgb-transfer",
                 "--records", str(records)]) == 2
    assert "line 1" in capsys.readouterr().err
    assert main(["tune", "dense:M=32,N=32,K=32", "--trials", "2", "--tuner", "xgb-transfer",
                 "--records", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["tune", "dense:M=32,N=32,K=32", "--trials", "2", "--save-records",
                 str(tmp_path / "no" / "dir.jsonl")]) == 2
