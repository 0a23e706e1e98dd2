"""``xgb-transfer`` jobs get their prior from the shared database (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import numpy as np
from search_synthetic import results, speeds

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tuner_service.cost_model import TransferCostModel
from tuner_service.db.engine import Database
from tuner_service.db.models import Job, JobTask, Measurement
from tuner_service.jobs.create import JobSpec, create_job
from tuner_service.jobs.records import import_lines
from tuner_service.jobs.run import JobRun
from tuner_service.jobs.scheduler import make_scheduler
from tuner_service.jobs.transfer import transfer_records
from tuner_service.tuners.model_based import ModelTuner

TARGET = "llvm"
TASK = "dense:M=64,N=64,K=64"
OTHER = "dense:M=128,N=96,K=128"


def record_lines(key: str, n: int, template: str = "dense.x86") -> str:
    workload = parse_workload(key)
    space = get_template(workload.op).space(workload)
    indices = space.sample(n, np.random.default_rng(4))
    lines = []
    for index, result in zip(indices, results(space, indices, fail_every=9), strict=True):
        lines.append(json.dumps({
            "workload": workload.key, "target": TARGET, "template": template,
            "template_version": 1, "config": {"index": index}, "result": result.to_json()}))
    return "\n".join(lines)


def test_a_transfer_job_starts_from_other_workloads(migrated_url: str) -> None:
    db = Database(migrated_url)
    with db.session() as session:
        assert import_lines(session, record_lines(OTHER, 120), 10_000)["imported"] == 120
        job = create_job(session, JobSpec(target=TARGET, trials_per_task=32,
                                          tuner="xgb-transfer", workloads=(TASK,)))
        job_id = job.id
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        jt = session.query(JobTask).filter_by(job_id=job_id).one()
        # this task's own measurement is not part of its prior
        session.add(Measurement(uid="own", job_task_id=jt.id, config_index=0, config={},
                                template="dense.x86", template_version=1, workload_key=TASK,
                                target=TARGET, state="done", costs=[0.1], mean_cost=0.1,
                                error_kind=0, error_message=""))
        session.flush()
        records = transfer_records(session, get_template("dense"), TARGET, jt.id)
        assert len(records) == 120 and {r.workload for r in records} == {OTHER}
        assert sum(not r.result.ok for r in records) == 120 // 9
        assert transfer_records(session, get_template("dense"), "cuda", jt.id) == []
        session.delete(session.get(Measurement, session.query(Measurement.id)
                                   .filter_by(uid="own").scalar()))
        run = JobRun.rebuild(session, job, make_scheduler("round-robin"))
    tuner = run.tasks[0].tuner
    assert isinstance(tuner, ModelTuner) and isinstance(tuner.model, TransferCostModel)
    first = tuner.ask(16)
    random = tuner.space.sample(200, np.random.default_rng(0), exclude=tuner.visited)
    assert speeds(tuner.space, first).mean() > 1.5 * speeds(tuner.space, random).mean()
