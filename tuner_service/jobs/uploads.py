"""Uploaded ONNX models: content-addressed (same bytes, same model) and split into tasks.

An upload is one ``.onnx`` file, or one zip/tar archive holding a ``.onnx`` and the external
data files it names (``frontend.archive``). The archive is the stored unit: its bytes are
hashed and counted whole, and the model's weights are read from its members only.

Pinned input shapes (``NAME=1x3x224x224``) change which tasks a model has, so they are part of
the content address: without any, ``sha256`` is the upload's SHA-256; with some, it is the
SHA-256 of the upload's digest followed by the canonical shapes (``a=1x3,b=2``). The shapes
live in that address and in the returned JSON, no new column is needed.

So does the layout the tasks are extracted for (``layout=nchwc`` or ``auto`` with the workers'
channel ``block``: the blocked conv workloads a library built with that layout runs,
``frontend.extract``): ``nchw`` (the default) keeps the address above, another layout adds
``layout:auto/16`` to the hashed text. A model with int8 layers adds the arithmetic they sum
in (``int8:exact`` or ``int8:sat16``, ``frontend.int8_arithmetic``), whose keys differ; one
stored before that (plain address) still answers an exact upload.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_service.db.models import Model, Task
from tuner_service.errors import InvalidInputError, PayloadTooLargeError, UnavailableError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class UploadLimits:
    """Uncompressed bytes and members an uploaded archive may unpack to."""

    max_bytes: int
    max_members: int


def store_model(session: Session, data: bytes, name: str, *, limits: UploadLimits,
                input_shapes: Sequence[str] = (), layout: str = "nchw",
                block: int | None = None, int8: str = "exact") -> tuple[Model, list[Task]]:
    """The model for these bytes (pinned shapes, task layout and int8 arithmetic), extracting
    and storing its tasks the first time. InvalidInputError for an unknown layout, block or
    arithmetic (``exact`` by default, what CUDA and VNNI workers compute; ``auto``: this
    server's CPU's, ``frontend.int8_arithmetic``)."""
    shapes = _parse_shapes(input_shapes)
    _check_layout(layout, block)
    arithmetic = _int8_arithmetic(int8)
    plan = "" if layout == "nchw" else f"{layout}/{block}"
    digest = model_digest(data, shapes, plan)
    # a quantized model's address names its int8 arithmetic (its tasks differ by it); a model
    # without int8 layers keeps the plain one, whatever the upload asked for
    quantized = model_digest(data, shapes, f"{plan}\nint8:{arithmetic}")
    for address in (quantized, digest):
        existing = session.scalar(select(Model).where(Model.sha256 == address))
        if existing is not None:
            tasks = model_tasks(session, existing.id)
            if address == quantized or arithmetic == "exact" or not _int8_tasks(tasks):
                return existing, tasks
    # End that read before the slow part: on SQLite the transaction holds the database's write
    # lock, and parsing a large model would stall every worker's report for seconds.
    session.rollback()
    extraction = _extract(data, shapes, limits, layout, block, arithmetic)
    if _int8_tasks([t.workload for t in extraction.tasks]):
        digest = quantized
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


def model_digest(data: bytes, shapes: str = "", layout: str = "") -> str:
    """The content address: the upload's SHA-256, combined with the pinned shapes and the
    task layout (``auto/16``) if any."""
    digest = hashlib.sha256(data).hexdigest()
    if not shapes and not layout:
        return digest
    text = f"{digest}\ninput-shapes:{shapes}" if shapes else digest
    if layout:
        text += f"\nlayout:{layout}"
    return hashlib.sha256(text.encode()).hexdigest()


def _int8_tasks(tasks: Sequence[Any]) -> bool:
    """Whether any task (a stored ``Task`` or a workload) is an int8 product, whose key the
    int8 arithmetic changes."""
    return any(t.op in ("dense_int8", "conv2d_int8") for t in tasks)


def model_tasks(session: Session, model_id: int) -> list[Task]:
    return list(session.scalars(select(Task).where(Task.model_id == model_id).order_by(Task.id)))


def _parse_shapes(items: Sequence[str]) -> str:
    """The pinned shapes in canonical form ("" for none); InvalidInputError if malformed."""
    if not items:
        return ""
    from tuner_service.compiler.frontend.errors import ModelError
    from tuner_service.compiler.frontend.shapes import format_input_shapes, parse_input_shapes

    try:
        return format_input_shapes(parse_input_shapes(items))
    except ModelError as e:
        raise InvalidInputError(str(e)) from e


def _check_layout(layout: str, block: int | None) -> None:
    try:
        from tuner_service.compiler.frontend.errors import ModelError
        from tuner_service.compiler.frontend.extract import check_task_layout
    except ImportError as e:
        raise UnavailableError(f"the ONNX frontend is not available: {e}") from e
    try:
        check_task_layout(layout, block)
    except ModelError as e:
        raise InvalidInputError(str(e)) from e


def _int8_arithmetic(int8: str) -> str:
    try:
        from tuner_service.compiler.frontend.errors import ModelError
        from tuner_service.compiler.frontend.int8_arithmetic import resolve_int8
    except ImportError as e:
        raise UnavailableError(f"the ONNX frontend is not available: {e}") from e
    try:
        return resolve_int8(int8)
    except ModelError as e:
        raise InvalidInputError(str(e)) from e


def _extract(data: bytes, shapes: str, limits: UploadLimits, layout: str,
             block: int | None, int8: str) -> Any:
    try:
        from tuner_service.compiler.frontend.archive import ArchiveLimits, is_archive, read_archive
        from tuner_service.compiler.frontend.errors import ModelError, ModelTooLarge
        from tuner_service.compiler.frontend.extract import extract_tasks
        from tuner_service.compiler.frontend.shapes import parse_input_shapes
    except ImportError as e:
        raise UnavailableError(f"the ONNX frontend is not available: {e}") from e
    pinned = parse_input_shapes(shapes.split(",")) if shapes else None
    try:
        if not is_archive(data):
            return extract_tasks(data, pinned, layout=layout, block=block, int8=int8)
        archive = read_archive(data, ArchiveLimits(limits.max_bytes, limits.max_members))
        return extract_tasks(archive.model, pinned, archive.files, layout=layout, block=block,
                             int8=int8)
    except ModelTooLarge as e:
        raise PayloadTooLargeError(str(e)) from e
    except ModelError as e:
        raise InvalidInputError(f"cannot read the model: {e}") from e


def _unsupported_json(item: Any) -> dict[str, str]:
    return {"op": str(item.op), "node": str(item.node), "reason": str(item.reason)}
