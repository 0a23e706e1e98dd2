"""Migration 0004 (time splits, hot-query indexes) on a database holding rows of 0003."""

from __future__ import annotations

import json

from sqlalchemy import inspect, text

from tuner_service.db.engine import make_engine
from tuner_service.db.migrate import current_revision, downgrade, upgrade

CONFIG = json.dumps({"index": 1})
INDEXES = {"ix_measurements_lease", "ix_measurements_finished", "ix_measurements_task_state"}


def _measurement_row(url: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO measurements (id, uid, config_index, config, template,"
                " template_version, workload_key, target, state, attempts, error_message,"
                f" costs, mean_cost, error_kind) VALUES (11, 'm11', 1, '{CONFIG}', 'dense.x86',"
                " 1, 'dense:M=8,N=16,K=32', 'llvm', 'done', 1, '', '[0.001]', 0.001, 0)"))
    finally:
        engine.dispose()


def _state(url: str) -> tuple[set[str], set[str], list[object]]:
    engine = make_engine(url)
    try:
        found = inspect(engine)
        indexes = {i["name"] or "" for i in found.get_indexes("measurements")}
        workers = {i["name"] or "" for i in found.get_indexes("workers")}
        columns = {c["name"] for c in found.get_columns("measurements")}
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(text(
                "SELECT id, mean_cost" + (", timings" if "timings" in columns else "")
                + " FROM measurements"))]
    finally:
        engine.dispose()
    return indexes | workers, columns, list(rows)


def test_upgrade_from_0003_keeps_rows_and_adds_timings_and_indexes(database_url: str) -> None:
    upgrade(database_url, "0003")
    _measurement_row(database_url)
    upgrade(database_url, "0004")
    assert current_revision(database_url) == "0004"
    indexes, columns, rows = _state(database_url)
    assert INDEXES | {"ix_workers_online"} <= indexes
    assert "timings" in columns
    assert rows == [(11, 0.001, None)]  # an old result has no time split

    downgrade(database_url, "0003")
    indexes, columns, rows = _state(database_url)
    assert not (INDEXES & indexes) and "timings" not in columns
    assert rows == [(11, 0.001)]
