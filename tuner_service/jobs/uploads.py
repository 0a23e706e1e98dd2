"""Uploaded ONNX models: content-addressed (same bytes, same model) and split into tasks."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_service.db.errors import InvalidInputError, UnavailableError
from tuner_service.db.models import Model, Task

logger = logging.getLogger(__name__)


def store_model(session: Session, data: bytes, name: str) -> tuple[Model, list[Task]]:
    """The model for these bytes, extracting and storing its tasks the first time."""
    digest = hashlib.sha256(data).hexdigest()
    existing = session.scalar(select(Model).where(Model.sha256 == digest))
    if existing is not None:
        return existing, model_tasks(session, existing.id)
    # End that read before the slow part: on SQLite the transaction holds the database's write
    # lock, and parsing a large model would stall every worker's report for seconds.
    session.rollback()
    extraction = _extract(data)
    model = Model(sha256=digest, name=name[:255], size_bytes=len(data),
                  unsupported=[_unsupported_json(u) for u in extraction.unsupported])
    session.add(model)
    session.flush()
    tasks = [
        Task(model_id=model.id, workload_key=t.workload.key, op=t.workload.op,
             weight=int(t.weight), flops=int(t.workload.flops()), nodes=list(t.nodes))
        for t in extraction.tasks
    ]
    session.add_all(tasks)
    session.flush()
    logger.info("stored model %d (%s): %d tasks, %d unsupported",
                model.id, name, len(tasks), len(model.unsupported))
    return model, tasks


def model_tasks(session: Session, model_id: int) -> list[Task]:
    return list(session.scalars(select(Task).where(Task.model_id == model_id).order_by(Task.id)))


def _extract(data: bytes) -> Any:
    try:
        from tuner_service.frontend.errors import ModelError
        from tuner_service.frontend.extract import extract_tasks
    except ImportError as e:
        raise UnavailableError(f"the ONNX frontend is not available: {e}") from e
    try:
        return extract_tasks(data)
    except ModelError as e:
        raise InvalidInputError(f"cannot read the model: {e}") from e


def _unsupported_json(item: Any) -> dict[str, str]:
    return {"op": str(item.op), "node": str(item.node), "reason": str(item.reason)}
