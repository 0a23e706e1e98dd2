"""Model inputs: what the graph declares, checking the arrays a user feeds, ``.npz`` in and out.

``tuner run --inputs FILE.npz`` feeds real data: every array is checked against the input it
names (a name the model lacks, a missing input, a wrong dtype or shape each get one sentence
that says what the model expects) before anything runs.
"""

from __future__ import annotations

import dataclasses
import logging
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper

from tuner_service.compiler.deploy.errors import FeedError

logger = logging.getLogger(__name__)

Dims = tuple[int | None, ...]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One graph input: its name, element dtype and dims (None: dynamic or unknown)."""

    name: str
    dtype: np.dtype
    dims: Dims | None  # None: no rank known

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        if self.dims is None or any(d is None for d in self.dims):
            return None
        return tuple(int(d) for d in self.dims if d is not None)

    def describe(self) -> str:
        dims = "?" if self.dims is None else "x".join("?" if d is None else str(d)
                                                      for d in self.dims)
        return f"{self.dtype.name}[{dims}]"


def input_specs(proto: onnx.ModelProto, constants: Mapping[str, object],
                shapes: Mapping[str, tuple[int, ...]]) -> list[InputSpec]:
    """The graph inputs that are not initializers; ``shapes`` (inferred) fill in dims."""
    specs = []
    for value in proto.graph.input:
        if value.name in constants:
            continue
        tensor = value.type.tensor_type
        elem = tensor.elem_type or onnx.TensorProto.FLOAT
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        dims: Dims | None = None
        if value.name in shapes:
            dims = tuple(shapes[value.name])
        elif tensor.HasField("shape"):
            dims = tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0
                         else None for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, dtype, dims))
    return specs


def check_feeds(specs: list[InputSpec], feeds: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """The feeds as contiguous arrays, or FeedError naming the first problem."""
    known = {spec.name for spec in specs}
    unknown = sorted(set(feeds) - known)
    if unknown:
        raise FeedError(f"the model has no input named {', '.join(map(repr, unknown))}; its "
                        f"inputs are {_listing(specs)}")
    missing = [spec.name for spec in specs if spec.name not in feeds]
    if missing:
        raise FeedError(f"missing model input {', '.join(map(repr, missing))}; the model's "
                        f"inputs are {_listing(specs)}")
    out = {}
    for spec in specs:
        value = np.asarray(feeds[spec.name])
        if value.dtype != spec.dtype:
            raise FeedError(f"input {spec.name!r} has dtype {value.dtype.name}, the model "
                            f"expects {spec.dtype.name} (convert it with .astype(np."
                            f"{spec.dtype.name}))")
        if not _shape_fits(value.shape, spec.dims):
            raise FeedError(f"input {spec.name!r} has shape "
                            f"{'x'.join(map(str, value.shape)) or 'scalar'}, the model expects "
                            f"{spec.describe()}")
        out[spec.name] = np.ascontiguousarray(value)
    return out


def _shape_fits(shape: tuple[int, ...], dims: Dims | None) -> bool:
    if dims is None:
        return True
    return len(shape) == len(dims) and all(d is None or d == s for s, d in zip(shape, dims,
                                                                                 strict=True))


def _listing(specs: list[InputSpec]) -> str:
    return ", ".join(f"{spec.name!r} {spec.describe()}" for spec in specs) or "(none)"


def random_feeds(specs: list[InputSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of the declared static shapes: standard normal floats; integers and
    booleans in {0, 1} (a valid token id, segment id and attention mask alike)."""
    dynamic = [spec.name for spec in specs if spec.static_shape is None]
    if dynamic:
        raise FeedError(f"inputs {dynamic} have dynamic shapes; pass arrays explicitly "
                        "(tuner run --inputs FILE.npz)")
    rng = np.random.default_rng(seed)
    out = {}
    for spec in specs:
        shape = spec.static_shape or ()
        if spec.dtype.kind == "f":
            out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype.kind in "iub":
            out[spec.name] = rng.integers(0, 2, shape).astype(spec.dtype)
        else:
            raise FeedError(f"input {spec.name!r} of dtype {spec.dtype.name} cannot be made "
                            "up at random; pass it with --inputs FILE.npz")
    return out


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Arrays of an ``.npz`` file (``np.savez``), pickles refused."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FeedError(f"inputs file {path} does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise FeedError(f"cannot read {path} as .npz (numpy.savez) arrays: {e}") from e
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise FeedError(f"{path} holds a single array; save the inputs by name with "
                        "numpy.savez(FILE, NAME=array, ...)")
    try:
        with data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise FeedError(f"cannot read {path} as .npz (numpy.savez) arrays: {e}") from e


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    try:
        with path.open("wb") as handle:
            named: dict[str, Any] = dict(arrays)
            np.savez(handle, allow_pickle=False, **named)
    except OSError as e:
        raise FeedError(f"cannot write outputs to {path}: {e.strerror or e}") from e
