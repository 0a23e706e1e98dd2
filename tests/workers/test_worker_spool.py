"""The spool keeps unacknowledged results across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.errors import WorkerError
from workers.spool import Spool


def result(measure_id: int) -> dict[str, object]:
    return {"measure_id": measure_id, "costs": [0.001], "error_kind": 0}


def test_results_survive_a_restart_and_leave_when_acknowledged(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        for i in range(3):
            spool.add(result(i))
        spool.remove([1])
    with Spool(tmp_path) as spool:
        assert [r["measure_id"] for r in spool.pending()] == [0, 2]
        spool.remove([0, 2, 99])
        assert len(spool) == 0
    with Spool(tmp_path) as spool:
        assert spool.pending() == []


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.add(result(1))
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"measure_id": 2, "co')
    with Spool(tmp_path) as spool:
        assert [r["measure_id"] for r in spool.pending()] == [1]


def test_the_same_result_twice_is_kept_once(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.add(result(7))
        spool.add(result(7))
        assert len(spool) == 1


def test_two_workers_cannot_share_a_spool(tmp_path: Path) -> None:
    with Spool(tmp_path), pytest.raises(WorkerError, match="another worker"):
        Spool(tmp_path)


def test_a_second_worker_on_the_host_gets_a_slot_of_its_own(tmp_path: Path) -> None:
    with Spool.acquire(tmp_path) as first, Spool.acquire(tmp_path) as second:
        assert first.directory == tmp_path
        assert second.directory == tmp_path / "worker-2"
        second.add(result(7))
        with Spool.acquire(tmp_path) as third:
            assert third.directory == tmp_path / "worker-3"
    # the slot of a worker that is gone is taken over with what it still holds
    with Spool.acquire(tmp_path) as again, Spool.acquire(tmp_path) as slot:
        assert again.directory == tmp_path
        assert [r["measure_id"] for r in slot.pending()] == [7]
