"""The runtime's libgomp wait policy: set before libgomp loads, never over a user's own."""

from __future__ import annotations

from tuner_service.compiler.deploy.loader import apply_wait_policy


def test_no_policy_leaves_libgomps_default() -> None:
    environ: dict[str, str] = {}
    assert apply_wait_policy(None, environ) == {} and environ == {}


def test_a_policy_name_or_a_spin_count_goes_to_its_variable() -> None:
    environ: dict[str, str] = {}
    assert apply_wait_policy("passive", environ) == {"OMP_WAIT_POLICY": "passive"}
    environ = {}
    apply_wait_policy("10000", environ)
    assert environ == {"GOMP_SPINCOUNT": "10000"}


def test_the_users_own_setting_wins() -> None:
    for variable in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        environ = {variable: "active"}
        assert apply_wait_policy("passive", environ) == {}
        assert environ == {variable: "active"}
