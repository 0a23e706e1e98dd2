"""Shared check for generated operators: compile, run at a thread count, compare to reference."""

from collections.abc import Callable

import numpy as np
import pytest

from schedule_templates.ops.base import GeneratedOp
from schedule_templates.ops.run import compile_op

RTOL = 1e-5


def random_inputs(op: GeneratedOp, positive: bool = False, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in op.input_shapes().items():
        x = rng.standard_normal(shape).astype(np.float32)
        out[name] = np.abs(x) + np.float32(0.1) if positive else x
    return out


def check(op: GeneratedOp, threads: tuple[int, ...] = (1, 2), exact: bool = False,
          positive: bool = False) -> None:
    inputs = random_inputs(op, positive)
    expected = op.reference(inputs)
    assert expected.shape == op.output_shape() and expected.dtype == np.float32
    compiled = compile_op(op)
    try:
        for t in threads:
            got = compiled(inputs, threads=t)
            assert got.shape == expected.shape
            if exact:
                np.testing.assert_array_equal(got, expected, err_msg=f"threads={t}")
            else:
                err = np.abs(got.astype(np.float64) - expected) / np.maximum(np.abs(expected), 1.0)
                assert float(err.max(initial=0.0)) <= RTOL, f"threads={t}: max rel err {err.max()}"
    finally:
        compiled.close()


@pytest.fixture
def check_op() -> Callable[..., None]:
    return check
