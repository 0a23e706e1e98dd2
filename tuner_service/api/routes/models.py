"""``POST /models``: upload an ONNX file (multipart field ``file``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Request, UploadFile

from tuner_service.api.deps import SessionDep, SettingsDep, UserToken
from tuner_service.api.schemas import ModelPublic
from tuner_service.db.errors import InvalidInputError, PayloadTooLargeError
from tuner_service.jobs.uploads import store_model

router = APIRouter(tags=["models"])


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
    file: Annotated[UploadFile, File()],
    session: SessionDep,
    settings: SettingsDep,
) -> ModelPublic:
    data = _read_limited(request, file, settings.max_upload_bytes)
    model, tasks = store_model(session, data, file.filename or "model.onnx")
    return ModelPublic.model_validate({
        "model_id": model.id, "name": model.name, "sha256": model.sha256,
        "tasks": [{"task_id": t.id, "workload": t.workload_key, "weight": t.weight,
                   "flops": t.flops} for t in tasks],
        "unsupported": model.unsupported,
    })
