"""docker-compose.yml and the Dockerfiles, checked without Docker: every command is a real
``tuner`` command line, every environment name a real setting, ports, volumes, health checks
and build inputs agree with each other and with the code."""

from __future__ import annotations

import argparse
import fnmatch
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from ops_compose import (
    ROOT,
    MissingVariable,
    commands,
    environment,
    interpolate,
    load_compose,
    variables,
)

from tuner_service.cli import worker as worker_cli
from tuner_service.cli.main import build_parser
from tuner_service.logging_setup import ENV_LOG_FORMAT
from tuner_service.settings import Settings

#: what an operator puts in .env (docker/env.example lists the names)
DOT_ENV = {
    "POSTGRES_PASSWORD": "0f4c6e2b9a7d4e1c8b3a5f6e7d8c9b0a1f2e3d4c5b6a7988",
    "TUNER_BOOTSTRAP_TOKEN": "admin-3f9d1c7b5e2a4f6b8d0c1e3a5b7d9f1e",
    "TUNER_WORKER_TOKEN": "worker-8c2e4a6b0d1f3e5a7c9b1d3f5a7c9e1b",
}
OUR_DOCKERFILES = ("docker/Dockerfile", "docker/Dockerfile.cuda")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    resolved: dict[str, Any] = interpolate(compose["services"], DOT_ENV)
    return resolved


def our_services(compose: dict[str, Any]) -> list[str]:
    """Services built from this repository (the others are stock images)."""
    return sorted(name for name, s in compose["services"].items() if "build" in s)


def setting_env_names() -> set[str]:
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return {(prefix + name).upper() for name in Settings.model_fields}


def worker_env_names() -> set[str]:
    """What ``tuner worker`` reads from the environment (it has no pydantic settings)."""
    return {worker_cli.ENV_SERVER, worker_cli.ENV_TOKEN, ENV_LOG_FORMAT}


def parse(words: list[str]) -> argparse.Namespace:
    assert words[0] == "tuner", f"{words}: not a tuner command"
    try:
        return build_parser().parse_args(words[1:])
    except SystemExit:
        pytest.fail(f"`{' '.join(words)}` is not a valid tuner command line")


def test_the_expected_services_exist(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"db", "server", "worker-cpu", "worker-gpu"}
    assert our_services(compose) == ["server", "worker-cpu", "worker-gpu"]


def test_required_secrets_are_refused_when_missing(compose: dict[str, Any]) -> None:
    for name in DOT_ENV:
        with pytest.raises(MissingVariable, match=name):
            interpolate(compose["services"], {**DOT_ENV, name: ""})


def test_the_server_migrates_then_serves(services: dict[str, Any]) -> None:
    steps = [parse(words) for words in commands(services["server"])]
    assert [(s.command, getattr(s, "db_command", None)) for s in steps] == [
        ("db", "upgrade"), ("serve", None)]
    assert all(callable(s.func) for s in steps)


@pytest.mark.parametrize("name", ["worker-cpu", "worker-gpu"])
def test_worker_commands_are_real(services: dict[str, Any], name: str) -> None:
    from schedule_templates.protocol import Target
    from schedule_templates.templates.base import all_templates
    from workers.backends import backend_names

    [words] = commands(services[name])
    args = parse(words)
    assert args.command == "worker" and args.func is worker_cli.run
    kind = Target.parse(args.target).kind
    backend = args.backend or kind
    kinds = {t.target_kind for t in all_templates()}
    if backend not in backend_names() or kind not in kinds:
        assert name == "worker-gpu", f"{name}: backend {backend!r} or target {args.target!r}"
        pytest.skip(f"the {backend!r} backend or its templates are not built yet (issue 6)")
    assert kind in kinds


def test_environment_names_are_real_settings(compose: dict[str, Any],
                                              services: dict[str, Any]) -> None:
    known = setting_env_names() | worker_env_names()
    for name in our_services(compose):
        unknown = set(environment(services[name])) - known
        assert not unknown, f"{name}: {sorted(unknown)} are not settings"
    worker_only = set(environment(services["worker-cpu"])) - setting_env_names()
    assert worker_only <= worker_env_names()


def test_the_server_environment_is_valid_in_production(
        services: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    env = environment(services["server"])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.environment == "production"
    assert settings.bootstrap_token is not None and settings.bootstrap_worker_token is not None
    assert settings.bootstrap_worker_token.get_secret_value() == DOT_ENV["TUNER_WORKER_TOKEN"]
    url = urlsplit(settings.database_url)
    db = services["db"]["environment"]
    assert (url.hostname, url.port, url.username, url.password, url.path) == (
        "db", 5432, db["POSTGRES_USER"], db["POSTGRES_PASSWORD"], f"/{db['POSTGRES_DB']}")


def test_ports_and_urls_agree(services: dict[str, Any]) -> None:
    port = int(environment(services["server"])["TUNER_PORT"])
    published = [str(p).rsplit(":", 1) for p in services["server"]["ports"]]
    assert [int(container) for _, container in published] == [port]
    health = " ".join(services["server"]["healthcheck"]["test"])
    assert f"127.0.0.1:{port}/api/v1/health" in health
    for name in ("worker-cpu", "worker-gpu"):
        server = urlsplit(environment(services[name])["TUNER_SERVER"])
        assert (server.hostname, server.port) == ("server", port)
        assert environment(services[name])["TUNER_TOKEN"] == DOT_ENV["TUNER_WORKER_TOKEN"]


def test_start_order_waits_for_health(services: dict[str, Any]) -> None:
    assert services["server"]["depends_on"] == {"db": {"condition": "service_healthy"}}
    for name in ("worker-cpu", "worker-gpu"):
        assert services[name]["depends_on"] == {"server": {"condition": "service_healthy"}}
    for name in ("db", "server"):
        assert services[name]["healthcheck"]["test"]


def test_volumes_are_declared_and_used(compose: dict[str, Any], services: dict[str, Any]
                                       ) -> None:
    used = {}
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source, target = str(mount).split(":")[:2]
            used[source] = (name, target)
    assert set(used) == set(compose["volumes"])
    assert used["pgdata"] == ("db", "/var/lib/postgresql/data")
    for volume in ("worker-cpu-spool", "worker-gpu-spool"):
        service, target = used[volume]
        dockerfile = (ROOT / services[service]["build"]["dockerfile"]).read_text()
        assert target in dockerfile, f"{target} is not created (and owned) in the image"


def test_the_gpu_worker_is_a_profile_with_an_nvidia_device(services: dict[str, Any]) -> None:
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert all("profiles" not in services[n] for n in ("db", "server", "worker-cpu"))


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("dockerfile", OUR_DOCKERFILES)
def test_dockerfile_inputs_exist(dockerfile: str) -> None:
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    copies = [rest.split() for word, rest in dockerfile_instructions(ROOT / dockerfile)
              if word == "COPY"]
    assert copies
    copied = {Path(src).parts[0] for *sources, _dest in copies for src in sources}
    assert {"pyproject.toml", "schedule_templates", "workers", "tuner_service",
            "migrations"} <= copied
    for *sources, _dest in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile}: COPY {source}: no such path"
            assert not any(fnmatch.fnmatch(source.rstrip("/"), p) for p in ignored), source


@pytest.mark.parametrize("dockerfile", OUR_DOCKERFILES)
def test_dockerfile_installs_a_real_extra_and_real_settings(dockerfile: str) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    steps = dockerfile_instructions(ROOT / dockerfile)
    args = dict(rest.partition("=")[::2] for word, rest in steps if word == "ARG")
    installs = [rest for word, rest in steps if word == "RUN" and "pip install" in rest]
    [install] = installs
    extra = re.search(r'\[([^\]]+)\]"', install)
    assert extra, install
    name = args.get("EXTRA", "") if extra.group(1) == "${EXTRA}" else extra.group(1)
    assert name in extras
    env_names = set(re.findall(r"\b(TUNER_[A-Z_]+)=", " ".join(
        rest for word, rest in steps if word == "ENV")))
    assert env_names <= setting_env_names() | worker_env_names()
    base = args.get("PYTHON_IMAGE") or args.get("CUDA_IMAGE", "")
    assert base.startswith("python:3.11-slim" if dockerfile.endswith("Dockerfile")
                           else "nvidia/cuda:")


def test_build_args_name_real_extras(services: dict[str, Any]) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert services["server"]["build"]["args"]["EXTRA"] == "server"
    assert services["worker-cpu"]["build"]["args"]["EXTRA"] == "worker"
    for name in ("server", "worker-cpu", "worker-gpu"):
        build = services[name]["build"]
        assert build["context"] == "." and build["dockerfile"] in OUR_DOCKERFILES
        assert build.get("args", {}).get("EXTRA", "server") in extras


def test_the_env_example_lists_exactly_what_compose_reads(compose: dict[str, Any]) -> None:
    example = {line.split("=", 1)[0] for line in
               (ROOT / "docker/env.example").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    named = variables((ROOT / "docker-compose.yml").read_text())
    assert example == set(named)
    required = {name for name, op in named.items() if op in (":?", "?")}
    assert required == set(DOT_ENV)
