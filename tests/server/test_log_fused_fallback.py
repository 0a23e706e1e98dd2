"""Best-config lookups: a fused workload and its base serve each other (one search space)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tuner_service.errors import NotFoundError
from tuner_service.jobs import log

BASE = "conv2d:N=1,C=8,H=10,W=10,K=32,R=3,S=3,pad=1"
# a key that starts like BASE but is another workload: the prefix match must not take it
LOOKALIKE = "conv2d:N=1,C=8,H=10,W=10,K=32,R=3,S=3,pad=1x1x1x0"


@pytest.fixture
def session(migrated_url: str) -> Iterator[object]:
    from tuner_service.db.engine import Database

    db = Database(migrated_url)
    try:
        with db.session() as s:
            yield s
    finally:
        db.dispose()


def _entry(session: object, key: str, cost: float, version: int = 1,
           target: str = "llvm") -> None:
    from tuner_service.db.models import TuningLogEntry

    session.add(TuningLogEntry(  # type: ignore[attr-defined]
        workload_key=key, op="conv2d", target=target, template="conv2d.x86",
        template_version=version, config={"index": int(cost * 1000)}, mean_cost=cost,
        gflops=1.0 / cost, measurement_id=None, job_id=None, device_key=None))
    session.flush()  # type: ignore[attr-defined]


def test_exact_key_wins(session: object) -> None:
    _entry(session, BASE, 2.0)
    _entry(session, f"{BASE},epilogue=bias+relu", 3.0)
    assert log.best(session, f"{BASE},epilogue=relu+bias", "llvm")["mean_cost"] == 3.0
    assert log.best(session, BASE, "llvm")["workload"] == BASE


def test_fused_key_falls_back_to_its_base(session: object) -> None:
    _entry(session, BASE, 2.0)
    _entry(session, f"{BASE},epilogue=bias", 1.0)  # faster sibling, but the base comes first
    answer = log.best(session, f"{BASE},epilogue=scale+bias+relu", "llvm")
    assert answer["workload"] == BASE


def test_base_key_falls_back_to_the_fastest_fused_variant(session: object) -> None:
    _entry(session, f"{BASE},epilogue=bias", 3.0)
    _entry(session, f"{BASE},epilogue=bias+relu", 2.0)
    _entry(session, f"{BASE},epilogue=relu", 1.0, version=0)  # an older template version
    _entry(session, LOOKALIKE, 0.5)
    _entry(session, f"{BASE},epilogue=residual", 0.1, target="llvm -mcpu=other")
    answer = log.best(session, BASE, "llvm")
    assert answer["workload"] == f"{BASE},epilogue=bias+relu"
    assert log.best(session, f"{BASE},epilogue=scale", "llvm")["workload"] == answer["workload"]


def test_no_family_entry_is_not_found(session: object) -> None:
    _entry(session, LOOKALIKE, 0.5)
    with pytest.raises(NotFoundError):
        log.best(session, f"{BASE},epilogue=relu", "llvm")


def test_an_int8_layer_and_its_fused_addition_serve_each_other(session: object) -> None:
    """BERT's int8 denses carry their bias addition (``add=u8``) in the key; the plain product
    shares their search space, both ways."""
    dense = "dense_int8:M=16,N=32,K=64"
    _entry(session, f"{dense},add=u8", 1.0)
    assert log.best(session, dense, "llvm")["workload"] == f"{dense},add=u8"
    _entry(session, dense, 2.0)
    assert log.best(session, f"{dense},add=s8", "llvm")["workload"] == dense
