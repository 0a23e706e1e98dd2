"""States stored by value and read back as members; errors mapped to HTTP in one table."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, update
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session

from schedule_templates.records import ErrorKind
from tuner_service.api.errors import STATUS, install_error_handlers
from tuner_service.api.worker_schemas import ResultIn
from tuner_service.compiler.deploy.errors import DeployError
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.cost_model import CostModelError
from tuner_service.db.errors import DatabaseBusyError, DatabaseError
from tuner_service.db.models import Base, Job, Measurement
from tuner_service.db.states import JobStatus, MeasurementState
from tuner_service.errors import AuthError, NotFoundError, TunerServiceError


def test_states_are_stored_as_their_values_and_read_back_as_members() -> None:
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add(Job(target="llvm", trials_per_task=1, tuner="random"))
        session.add(Measurement(uid="u", config_index=0, config={}, template="t",
                                template_version=1, workload_key="k", target="llvm",
                                error_kind=ErrorKind.RUNTIME))
        session.flush()
        session.execute(update(Job).values(status="running"))  # a value is accepted as well
        raw = session.connection().exec_driver_sql(
            "SELECT jobs.status, measurements.state, measurements.error_kind "
            "FROM jobs, measurements").one()
        assert tuple(raw) == ("running", "queued", 4)
        assert session.scalars(select(Job.status)).one() is JobStatus.RUNNING
        measurement = session.scalars(select(Measurement)).one()
        assert measurement.state is MeasurementState.QUEUED
        assert measurement.error_kind is ErrorKind.RUNTIME
        with pytest.raises(StatementError, match="not a valid JobStatus"):
            session.execute(update(Job).values(status="finished"))


def test_the_reported_error_kind_is_bounded_by_the_enum() -> None:
    assert ResultIn(measure_id=1, error_kind=max(ErrorKind)).error_kind == ErrorKind.UNKNOWN
    with pytest.raises(ValueError, match="less than or equal"):
        ResultIn(measure_id=1, error_kind=max(ErrorKind) + 1)


@pytest.mark.parametrize(("error", "status", "retry_after"), [
    (NotFoundError("no job 7"), 404, None),
    (AuthError("no token"), 401, None),
    (DatabaseError("down"), 503, "2"),
    (DatabaseBusyError("busy"), 503, "1"),  # the nearest class wins
    (ModelError("not ONNX"), 500, None),  # every package's root is a TunerServiceError
    (DeployError("no library"), 500, None),
    (CostModelError("untrained"), 500, None),
])
def test_errors_become_statuses_in_the_api_only(error: TunerServiceError, status: int,
                                                retry_after: str | None) -> None:
    assert not hasattr(error, "status_code")
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/fail")
    def fail() -> None:
        raise error

    response = TestClient(app).get("/fail")
    assert response.status_code == status
    assert response.json() == {"detail": str(error)}
    assert response.headers.get("Retry-After") == retry_after
    assert all(issubclass(cls, TunerServiceError) for cls in STATUS)
