"""``POST /models``: upload an ONNX model (multipart field ``file``).

``file`` is a self-contained ``.onnx``, or a zip/tar archive of a ``.onnx`` and its external
data files. ``input_shape`` (repeatable form field, ``NAME=1x3x224x224``) pins dynamic input
dimensions before tasks are extracted. ``layout`` (``nchw``, the default; ``nchwc``; ``auto``:
both) and ``block`` (the workers' vector width in floats, 8 or 16) extract the tasks of a library
built with that layout: its conv-family layers as blocked workloads.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile

from tuner_service.api.deps import SessionDep, SettingsDep, UserToken
from tuner_service.api.schemas import ModelPublic
from tuner_service.errors import InvalidInputError, PayloadTooLargeError
from tuner_service.jobs.uploads import UploadLimits, store_model

router = APIRouter(tags=["models"])

#: most pinned inputs one upload may name
MAX_INPUT_SHAPES = 64


def _read_limited(request: Request, file: UploadFile, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + 64 * 1024:  # multipart framing slack
        raise PayloadTooLargeError(f"upload larger than the {limit}-byte limit")
    data = file.file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLargeError(f"upload larger than the {limit}-byte limit")
    if not data:
        raise InvalidInputError("the uploaded file is empty")
    return data


@router.post("/models", response_model=ModelPublic, status_code=201)
def upload_model(
    _token: UserToken,
    request: Request,
    file: Annotated[UploadFile, File(description="an .onnx file, or a zip/tar archive of one "
                                     ".onnx and its external data files")],
    session: SessionDep,
    settings: SettingsDep,
    input_shape: Annotated[list[str] | None, Form(
        description="pin a dynamic input: NAME=1x3x224x224 (repeat the field per input)",
        max_length=MAX_INPUT_SHAPES)] = None,
    layout: Annotated[str, Form(
        description="the library layout to extract tasks for: nchw, nchwc or auto (both)",
        max_length=8)] = "nchw",
    block: Annotated[int | None, Form(
        description="channel block of a blocked layout (the workers' floats per vector)",
        ge=1, le=64)] = None,
    int8: Annotated[str, Form(
        description="how the library's int8 layers sum their products: exact (the default), "
        "sat16 (pairs in saturating 16 bits, onnxruntime's arithmetic on CPUs without VNNI; "
        "`tuner submit` and `tuner tune` send their CPU's for CPU targets) or auto (this "
        "server's CPU's)", max_length=8)] = "exact",
) -> ModelPublic:
    data = _read_limited(request, file, settings.max_upload_bytes)
    limits = UploadLimits(settings.max_model_bytes, settings.max_archive_members)
    model, tasks = store_model(session, data, file.filename or "model.onnx", limits=limits,
                               input_shapes=input_shape or (), layout=layout, block=block,
                               int8=int8)
    return ModelPublic.model_validate({
        "model_id": model.id, "name": model.name, "sha256": model.sha256,
        "tasks": [{"task_id": t.id, "workload": t.workload_key, "weight": t.weight,
                   "flops": t.flops} for t in tasks],
        "unsupported": model.unsupported,
    })
