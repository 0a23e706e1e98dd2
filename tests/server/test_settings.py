"""Settings: environment prefix, derived database URL, refusing default secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from tuner_service.settings import Settings


def test_environment_prefix_and_default_database(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("TUNER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TUNER_LEASE_S", "12")
    settings = Settings()
    assert settings.lease_s == 12.0
    assert settings.resolved_database_url == f"sqlite:///{(tmp_path / 'tuner.db').resolve()}"
    assert settings.with_overrides(port=9000, host=None).port == 9000


def test_production_refuses_default_secrets() -> None:
    with pytest.raises(ValidationError, match="default or short secret"):
        Settings(environment="production", bootstrap_token=SecretStr("change-me"))
    good = Settings(environment="production", bootstrap_token=SecretStr("x" * 32))
    assert good.bootstrap_token is not None
    dev = Settings(environment="development", bootstrap_token=SecretStr("change-me"))
    assert dev.bootstrap_token is not None


def test_bootstrap_token_is_accepted_as_admin(settings: Settings,
                                              make_client: object) -> None:
    secret = "a-long-random-deployment-secret-0123456789"
    client = make_client(settings.with_overrides(bootstrap_token=secret))  # type: ignore[operator]
    answer = client.post("/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"},
                         json={"workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 1})
    assert answer.status_code == 201, answer.text
