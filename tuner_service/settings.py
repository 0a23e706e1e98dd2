"""Service settings: one pydantic-settings object (environment prefix ``TUNER_``).

Built by ``get_settings()`` (cached) for the CLI, or passed explicitly to ``create_app`` (tests);
routes receive it through a dependency. Nothing else in the package reads the environment.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schedule_templates.records import MeasureOptions

#: example values from the docs; never acceptable outside development
_DEFAULT_SECRETS = frozenset({"", "change-me", "changeme", "secret", "admin", "tuner"})


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    environment: Literal["development", "production"] = "development"
    data_dir: Path = Path(".tuner")
    #: empty means a SQLite file in ``data_dir``; a PostgreSQL URL makes a shared deployment
    database_url: str = ""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)

    # Work queue
    #: short, and renewed by each heartbeat of the worker holding the items, so a dead
    #: worker's candidates are measured again after about two heartbeat periods
    lease_s: float = Field(default=25.0, gt=0)
    heartbeat_s: float = Field(default=10.0, gt=0)
    claim_max_wait_s: float = Field(default=30.0, ge=0)
    claim_max_items: int = Field(default=64, ge=1)
    max_attempts: int = Field(default=3, ge=1)

    # Job driver
    batch_size: int = Field(default=8, ge=1)  # configs asked from a task's tuner at once
    queue_depth: int = Field(default=16, ge=1)  # measurements in flight per job, at least
    #: more in flight per live worker able to serve a job: its depth is
    #: max(queue_depth, queue_per_worker x live workers), so added workers do not idle
    queue_per_worker: int = Field(default=2, ge=0)
    #: and enough for this many seconds of results at the rate they arrive, so the queue
    #: outlasts a round of model refits (``jobs.driver``)
    queue_ahead_s: float = Field(default=3.0, ge=0, le=600)
    driver_interval_s: float = Field(default=0.5, gt=0)
    #: how a job shares its slots among tasks: by expected end-to-end latency saved per trial
    #: ("gradient") or in turn ("round-robin"); see tuner_service/jobs/scheduler.py
    task_scheduler: Literal["gradient", "round-robin"] = "gradient"
    #: a task stops once its best has not improved by 1% for this many trials (0: never)
    early_stop: int = Field(default=0, ge=0)
    #: before a task's best is stored, its this many fastest configs (plus the default and the
    #: best known one) are measured again, interleaved, ``confirm_rounds`` times (0: off)
    confirm_top: int = Field(default=3, ge=0, le=64)
    confirm_rounds: int = Field(default=2, ge=0, le=16)
    driver_lease_s: float = Field(default=30.0, gt=0)
    run_driver: bool = True

    # Inputs
    max_upload_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    #: a model uploaded as a zip/tar archive (``.onnx`` + external data): uncompressed bytes
    #: of all its members together, and how many members it may have
    max_model_bytes: int = Field(default=2 * 1024 * 1024 * 1024, ge=1)
    max_archive_members: int = Field(default=4096, ge=1)
    max_import_lines: int = Field(default=1_000_000, ge=1)

    # Security
    read_requires_token: bool = False
    #: an admin token accepted from the environment (deployments); stored hashed at start
    bootstrap_token: SecretStr | None = None
    #: a worker-role token accepted from the environment, so deployed workers hold no admin token
    bootstrap_worker_token: SecretStr | None = None
    check_schema: bool = True
    #: seconds a worker's token check is reused by its claims and reports (``api.worker_auth``):
    #: a revoked token or a deleted worker is refused at most this long after; 0 checks each time
    worker_auth_cache_s: float = Field(default=2.0, ge=0, le=60)
    #: how long a request waits for SQLite's write lock or a pooled database connection before
    #: it is answered 503 with Retry-After (rather than hanging)
    database_busy_timeout_s: float = Field(default=10.0, gt=0, le=300)

    # Resource budget: what one job may ask of a worker, checked when the job is created
    budget_max_tensor_bytes: int = Field(default=1 << 30, ge=1)
    budget_max_candidate_flops: int = Field(default=500 * 10**9, ge=1)
    budget_max_number: int = Field(default=10_000, ge=1)
    budget_max_repeat: int = Field(default=100, ge=1)
    budget_max_min_repeat_ms: float = Field(default=10_000.0, ge=0)
    budget_max_build_timeout_s: float = Field(default=300.0, gt=0)
    budget_max_run_timeout_s: float = Field(default=120.0, gt=0)

    # Logging: text or JSON lines. The CLI reads TUNER_LOG_FORMAT itself before settings exist
    # (tuner_service/logging_setup.py); the field is here so `tuner serve` validates it.
    log_format: Literal["text", "json"] = "text"
    #: uvicorn's access log, one line per request (``tuner serve --no-access-log``): on by
    #: default; a server feeding hundreds of workers spends a few percent of its CPU on it
    access_log: bool = True

    # Defaults of the run protocol sent to workers
    measure_number: int = Field(default=1, ge=1)
    measure_repeat: int = Field(default=3, ge=1)
    measure_min_repeat_ms: float = Field(default=50.0, ge=0)
    measure_flush_cache: bool = False
    build_timeout_s: float = Field(default=20.0, gt=0)
    run_timeout_s: float = Field(default=20.0, gt=0)
    #: threads per measurement when a job does not say (a worker caps it at what it allows)
    measure_threads: int = Field(default=1, ge=1)

    # Client side (CLI)
    server_url: str = ""
    token: SecretStr | None = None

    @model_validator(mode="after")
    def _refuse_default_secrets(self) -> Settings:
        if self.environment == "development":
            return self
        for name in ("bootstrap_token", "bootstrap_worker_token"):
            value: SecretStr | None = getattr(self, name)
            secret = value.get_secret_value() if value is not None else None
            if secret is not None and (secret.lower() in _DEFAULT_SECRETS or len(secret) < 24):
                raise ValueError(
                    f"TUNER_{name.upper()} is a default or short secret; outside development "
                    "set a random value of at least 24 characters (or leave it unset)"
                )
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'tuner.db').resolve()}"

    @property
    def client_file(self) -> Path:
        """Where the embedded mode saves the server URL and token for the CLI."""
        return self.data_dir / "client.json"

    def measure_options(self) -> MeasureOptions:
        return MeasureOptions(
            number=self.measure_number,
            repeat=self.measure_repeat,
            min_repeat_ms=self.measure_min_repeat_ms,
            flush_cache=self.measure_flush_cache,
            build_timeout_s=self.build_timeout_s,
            run_timeout_s=self.run_timeout_s,
        )

    def with_overrides(self, **values: Any) -> Settings:
        """A copy with some fields replaced (CLI flags); ``None`` values are ignored."""
        given = {k: v for k, v in values.items() if v is not None}
        return self.model_validate({**self.model_dump(), **given}) if given else self


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process settings from the environment, built on first use."""
    return Settings()
