"""Migration 0003 (device classes) on a database holding rows written at revision 0002."""

from __future__ import annotations

import json

from sqlalchemy import text

from tuner_service.db.engine import make_engine
from tuner_service.db.migrate import current_revision, downgrade, upgrade
from tuner_service.jobs import log

from .device_support import ZEN4

KEY = "dense:M=8,N=16,K=32"
CONFIG = json.dumps({"index": 1})


def _seed_old_rows(url: str) -> None:
    """What a 0002 deployment holds: a 4-thread job with a measured best, an imported best."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO jobs (id, target, trials_per_task, tuner, options, threads, status,"
                " message) VALUES (7, 'llvm', 4, 'random', '{}', 4, 'done', '')"))
            conn.execute(text(
                "INSERT INTO tasks (id, workload_key, op, weight, flops, nodes) "
                f"VALUES (3, '{KEY}', 'dense', 1, 8192, '[]')"))
            conn.execute(text(
                "INSERT INTO job_tasks (id, job_id, task_id, trials_budget, trials_done, status,"
                " message) VALUES (5, 7, 3, 4, 4, 'done', '')"))
            conn.execute(text(
                "INSERT INTO measurements (id, uid, job_task_id, config_index, config, template,"
                f" template_version, workload_key, target, state, attempts, error_message,"
                f" costs, mean_cost, error_kind) VALUES (11, 'm11', 5, 1, '{CONFIG}', "
                f"'dense.x86', 1, '{KEY}', 'llvm', 'done', 1, '', '[0.001]', 0.001, 0)"))
            for key, cost, job in ((KEY, 0.001, "7"), ("dense:M=4,N=8,K=8", 0.002, "NULL")):
                conn.execute(text(
                    "INSERT INTO tuning_log (workload_key, op, target, template,"
                    " template_version, config, mean_cost, gflops, job_id) VALUES "
                    f"('{key}', 'dense', 'llvm', 'dense.x86', 1, '{CONFIG}', {cost}, 1.0, {job})"))
    finally:
        engine.dispose()


def test_upgrade_from_0002_migrates_existing_rows(database_url: str) -> None:
    upgrade(database_url, "0002")
    _seed_old_rows(database_url)
    upgrade(database_url, "0003")
    assert current_revision(database_url) == "0003"
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            entries = conn.execute(text(
                "SELECT workload_key, device_class, microarch, isa_level, threads, confirmed "
                "FROM tuning_log ORDER BY workload_key")).all()
            measured = conn.execute(text(
                "SELECT device_class, threads, purpose FROM measurements")).one()
    finally:
        engine.dispose()
    # the job's entry keeps the job's 4 threads; the import's thread count is not known: 1
    assert [tuple(e) for e in entries] == [
        ("dense:M=4,N=8,K=8", "unknown", "unknown", "unknown", 1, False),
        (KEY, "unknown", "unknown", "unknown", 4, False)]
    assert tuple(measured) == (None, 4, "tune")


def test_migrated_rows_answer_only_lookups_without_a_device_class(database_url: str) -> None:
    from tuner_service.db.engine import Database

    upgrade(database_url, "0002")
    _seed_old_rows(database_url)
    upgrade(database_url)
    db = Database(database_url)
    try:
        with db.session() as session:
            anywhere = log.best(session, KEY, "llvm")
            zen4 = log.best(session, KEY, "llvm", ZEN4, 4)
    finally:
        db.dispose()
    assert anywhere["match"] == "any" and anywhere["config"] == {"index": 1}
    # where an unknown entry was measured is not known: a ZEN4 build gets the default
    assert zen4["match"] == "default" and zen4["mean_cost"] is None


def test_downgrade_keeps_the_fastest_entry_per_workload(database_url: str) -> None:
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            for device_class, cost in ((ZEN4, 0.003), ("unknown", 0.002)):
                conn.execute(text(
                    "INSERT INTO tuning_log (workload_key, op, target, template,"
                    " template_version, config, mean_cost, gflops, device_class, threads) "
                    f"VALUES ('{KEY}', 'dense', 'llvm', 'dense.x86', 1, '{CONFIG}', {cost}, 1.0,"
                    f" '{device_class}', 1)"))
        downgrade(database_url, "0002")
        with engine.connect() as conn:
            left = conn.execute(text("SELECT mean_cost FROM tuning_log")).scalars().all()
    finally:
        engine.dispose()
    assert left == [0.002]
    upgrade(database_url, "0003")
    assert current_revision(database_url) == "0003"
