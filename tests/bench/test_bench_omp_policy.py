"""bench/omp_policy.py's environments and order (nothing is timed)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import omp_policy


def test_each_policy_replaces_the_callers_wait_settings() -> None:
    base = {"PATH": "/bin", "OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "5"}
    assert omp_policy.policy_env("default", base) == {"PATH": "/bin"}
    assert omp_policy.policy_env("passive", base) == {"PATH": "/bin",
                                                      "OMP_WAIT_POLICY": "passive"}
    assert omp_policy.policy_env("spin10000", base) == {"PATH": "/bin",
                                                        "GOMP_SPINCOUNT": "10000"}


def test_rounds_rotate_so_every_policy_takes_every_position() -> None:
    names = list(omp_policy.POLICIES)
    firsts = {omp_policy.rotation(names, r)[0] for r in range(len(names))}
    assert firsts == set(names)
    assert sorted(omp_policy.rotation(names, 3)) == sorted(names)
