"""Best configs per device class: fallback levels, separate bests for two classes tuning the
same workload, builds picking their own, and packs carried between deployments."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tuner_service.compiler.deploy.configs import ConfigBook, entries_from_json, load_configs_file
from tuner_service.db.engine import Database
from tuner_service.db.models import TuningLogEntry
from tuner_service.jobs.device import class_columns
from tuner_service.settings import Settings

from .device_support import GRAVITON, SPR, ZEN4, ZEN4_BIG, ZEN5, ClassWorker, submit
from .fakes import bearer

KEY = "dense:M=16,N=32,K=64"
ICELAKE = "cpu:intel:icelake-server:x86-64-v4:intel-xeon-platinum-8375c:32c"


def valid_configs(count: int) -> list[dict[str, Any]]:
    workload = parse_workload(KEY)
    template = get_template("dense", "llvm")
    space = template.space(workload)
    found = []
    for index in range(space.size):
        if space.is_valid(index):
            found.append(space.get(index).to_json())
        if len(found) == count:
            return found
    raise AssertionError("the space has too few valid configs")


def seed(settings: Settings, rows: list[tuple[str, int, float, dict[str, Any]]]) -> None:
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            for device_class, threads, cost, config in rows:
                session.add(TuningLogEntry(
                    workload_key=KEY, op="dense", target="llvm", template="dense.x86",
                    template_version=int(get_template("dense", "llvm").version), config=config,
                    mean_cost=cost, gflops=1.0, **class_columns(
                        None if device_class == "unknown" else device_class),
                    threads=threads))
    finally:
        db.dispose()


def best(client: TestClient, device_class: str | None = None, threads: int = 1
         ) -> dict[str, Any]:
    params: dict[str, Any] = {"workload": KEY, "target": "llvm", "threads": threads}
    if device_class:
        params["device_class"] = device_class
    answer = client.get("/api/v1/best", params=params)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_lookups_fall_back_exact_microarch_isa_default(client: TestClient,
                                                       settings: Settings) -> None:
    a, b, c, d = valid_configs(4)
    seed(settings, [(ZEN4, 1, 3e-5, a), (ZEN5, 2, 2e-5, b), (SPR, 1, 2.5e-5, c),
                    ("unknown", 1, 1e-5, d)])
    assert (best(client, ZEN4)["match"], best(client, ZEN4)["config"]) == ("exact", a)
    # another model / core count of Zen 4, or Zen 4 at another thread count
    assert (best(client, ZEN4_BIG)["match"], best(client, ZEN4_BIG)["config"]) == ("microarch", a)
    assert best(client, ZEN4, threads=2)["match"] == "microarch"
    # same ISA level: the same thread count first (SPR and Zen 4 at 1), then the faster
    icelake = best(client, ICELAKE)
    assert (icelake["match"], icelake["config"], icelake["device_class"]) == ("isa_level", c, SPR)
    assert best(client, ICELAKE, threads=2)["device_class"] == ZEN5
    # nothing related (an Arm server): the template default, and no cost
    arm = best(client, GRAVITON)
    default = get_template("dense", "llvm").default_config(parse_workload(KEY)).to_json()
    assert (arm["match"], arm["config"], arm["mean_cost"]) == ("default", default, None)
    # no class named: the fastest of any class, entries from before classes included
    assert (best(client)["match"], best(client)["config"]) == ("any", d)
    bad = client.get("/api/v1/best", params={"workload": KEY, "device_class": "zen4"})
    assert bad.status_code == 422 and "kind:vendor" in bad.text


def fastest_low(index: int) -> list[float]:
    return [1e-5 * (1 + index % 97)] * 3


def fastest_high(index: int) -> list[float]:
    return [1e-5 * (98 - index % 97)] * 3


def test_two_device_classes_keep_their_own_best_and_builds_pick_theirs(
        client: TestClient, tokens: dict[str, str]) -> None:
    zen4 = ClassWorker(client, tokens["worker"], ZEN4, fastest_low, device_key="zen4-box")
    # the second device: what a fake backend declaring another class reports
    zen5 = ClassWorker(client, tokens["worker"], ZEN5, fastest_high, device_key="zen5-box")
    jobs = {w.device_class: submit(client, tokens["user"], [KEY], 8, device_key=k)
            for w, k in ((zen4, "zen4-box"), (zen5, "zen5-box"))}
    for worker in (zen4, zen5):
        assert worker.run_until_done(jobs[worker.device_class])["status"] == "done"
    entries = client.get("/api/v1/tuning-log", params={"workload": KEY}).json()
    assert sorted(e["device_class"] for e in entries) == sorted([ZEN4, ZEN5])
    for worker, costs in ((zen4, fastest_low), (zen5, fastest_high)):
        mine = best(client, worker.device_class)
        measured = {index for _id, index in worker.measured}
        assert mine["match"] == "exact" and mine["confirmed"]
        assert mine["config"]["index"] == min(measured, key=lambda i: costs(i)[0])
        # what `tuner build --server` reads for this device, and the config it builds with
        pack = client.get("/api/v1/packs", params={
            "device_class": worker.device_class, "target": "llvm", "threads": 1,
            "resolve": True}).json()
        book = ConfigBook(entries_from_json(pack["tasks"], "server"), "llvm")
        workload = parse_workload(KEY)
        choice = book.choose(workload, get_template("dense", "llvm"))
        assert choice is not None and choice.config.index == mine["config"]["index"]
    assert best(client, ZEN4)["config"] != best(client, ZEN5)["config"]


def test_packs_round_trip_between_deployments(
        client: TestClient, tokens: dict[str, str], settings: Settings, tmp_path: Path,
        make_client: Callable[[Settings], TestClient]) -> None:
    a, b = valid_configs(2)
    seed(settings, [(ZEN4, 1, 3e-5, a), (ZEN4, 2, 2e-5, b), (SPR, 1, 1e-5, b)])
    pack = client.get("/api/v1/packs", params={"device_class": ZEN4}).json()
    assert pack["format"] == "tuner-pack" and len(pack["tasks"]) == 2
    assert {t["device_class"] for t in pack["tasks"]} == {ZEN4}
    path = tmp_path / "pack.json"
    path.write_text(json.dumps(pack))
    # `tuner build --configs pack.json` reads it as is
    assert len(load_configs_file(path, "llvm")) == 1  # one workload, fastest thread count kept

    other_settings = settings.with_overrides(data_dir=tmp_path / "other",
                                             database_url=f"sqlite:///{tmp_path / 'o.db'}")
    from tuner_service.db.migrate import upgrade

    upgrade(other_settings.resolved_database_url)
    other = make_client(other_settings)
    from tuner_service import auth

    db = Database(other_settings.resolved_database_url)
    with db.session() as session:
        token = auth.create_token(session, "user", "pack")[1]
    db.dispose()
    answer = other.post("/api/v1/packs", content=path.read_text(), headers=bearer(token))
    assert answer.json() == {"imported": 2, "device_classes": [ZEN4]}
    assert (best(other, ZEN4)["config"], best(other, ZEN4, threads=2)["config"]) == (a, b)
    again = other.post("/api/v1/packs", content=path.read_text(), headers=bearer(token))
    assert again.status_code == 200  # importing twice changes nothing
    assert len(other.get("/api/v1/tuning-log").json()) == 2

    broken = json.loads(path.read_text())
    broken["tasks"][1]["device_class"] = "somewhere"
    broken["tasks"][0]["config"] = {"index": 10**12}
    refused = other.post("/api/v1/packs", content=json.dumps(broken), headers=bearer(token))
    assert refused.status_code == 422
    assert [e["entry"] for e in refused.json()["detail"]["errors"]] == [0, 1]
    for body in ("[]", "{not json", json.dumps({**pack, "version": 99})):
        assert other.post("/api/v1/packs", content=body,
                          headers=bearer(token)).status_code == 422
    assert other.post("/api/v1/packs", content=path.read_text()).status_code == 401


@pytest.mark.parametrize("resolve", [False, True])
def test_pack_queries_are_checked(client: TestClient, resolve: bool) -> None:
    answer = client.get("/api/v1/packs", params={"device_class": "nope", "resolve": resolve,
                                                 "target": "llvm"})
    assert answer.status_code == 422


def test_transfer_priors_keep_the_closest_device_level_with_enough_records() -> None:
    from tuner_service.jobs.transfer import MIN_LEVEL_RECORDS, closest_rows

    def rows(device_class: str | None, count: int) -> list[tuple[Any, ...]]:
        return [(KEY, i, [1e-4], 0, device_class) for i in range(count)]

    same_arch, same_isa, unknown = (rows(ZEN4_BIG, MIN_LEVEL_RECORDS), rows(ZEN5, 40),
                                    rows(None, 5))
    everything = same_isa + same_arch + unknown
    assert closest_rows(everything, ZEN4) == same_arch  # no Zen 4 2c records: other Zen 4s
    few = same_isa + same_arch[:10] + unknown
    assert closest_rows(few, ZEN4) == same_isa + same_arch[:10]  # too few: the ISA level
    assert closest_rows(everything, GRAVITON) == everything  # nothing related: all of them
