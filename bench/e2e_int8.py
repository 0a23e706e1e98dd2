"""The int8 columns of the end-to-end benchmark (``bench/e2e.py --int8``): each model quantized
by onnxruntime's own tool (``quantize_static``, QDQ, uint8 activations, per-channel int8
weights, calibrated on a few seeded random inputs), cached beside the fp32 exports, then timed
with our default and tuned builds, onnxruntime and OpenVINO on the same quantized file in the
same run. The tuned configs come from the same real ``tuner tune`` job as the fp32 rows'
(``e2e_tune``, cached as ``MODEL-int8``): its tasks are the int8 layers. With
``reduce_range`` (``bench/e2e.py --reduce-range``) the weights are quantized to 7 bits, as
onnxruntime advises for CPUs without VNNI (rows ``MODEL-int8r``): every engine's u8 x s8
products then fit its 16-bit pair sums, and ours run on ``vpmaddubsw`` there.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
from e2e_models import CACHE, BenchModel, ModelUnavailable
from zoo import build, run_ours, run_peer

logger = logging.getLogger("e2e.int8")
CALIBRATION_SAMPLES = 4


def quantized_model(model: BenchModel, reduce_range: bool = False) -> BenchModel:
    """The QDQ int8 version of ``model`` (quantized now unless cached for these bytes), with
    7-bit weights for ``reduce_range``."""
    data = model.path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    suffix = "int8r" if reduce_range else "int8"
    path = CACHE / "int8" / f"{model.name}-{'r-' if reduce_range else ''}{digest}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            _quantize(model.path, path, reduce_range)
        except Exception as e:  # onnxruntime's quantizer raises anything; report, not crash
            raise ModelUnavailable(f"{model.name}: quantize_static failed: {e}") from e
    return BenchModel(f"{model.name}-{suffix}", model.kind, path)


def _quantize(source: Path, target: Path, reduce_range: bool) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    feeds = [_random_feeds(source, seed) for seed in range(CALIBRATION_SAMPLES)]

    class Reader:
        def __init__(self) -> None:
            self.left = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.left, None)

    partial = target.with_suffix(".partial")
    quantize_static(source, partial, Reader(), quant_format=QuantFormat.QDQ,  # type: ignore[arg-type]
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True, reduce_range=reduce_range)
    partial.rename(target)


def _random_feeds(path: Path, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs of the model's declared shapes (dynamic dims 1): normal floats, zeros
    for integer inputs (token ids, masks)."""
    import onnx

    rng = np.random.default_rng(seed)
    proto = onnx.load(path, load_external_data=False)
    weights = {t.name for t in proto.graph.initializer}
    feeds = {}
    for value in proto.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[value.name] = (rng.normal(0, 1, shape).astype(dtype)
                             if np.issubdtype(dtype, np.floating) else np.ones(shape, dtype))
    return feeds


def int8_libraries(tmp: Path, threads: int) -> dict[str, Path]:
    """Where ``int8_rows`` builds the default library and the one tuned at ``threads``."""
    return {"default": tmp / "int8-default", "tuned": tmp / f"int8-tuned-t{threads}"}


def int8_rows(model: BenchModel, threads: list[int], iterations: int, tmp: Path,
              tunings: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per thread count: ours (default configs, and tuned where ``tunings`` has
    configs for that count), onnxruntime and OpenVINO on the quantized file."""
    library = int8_libraries(tmp, 0)["default"]
    built = build(str(model.path), library)
    rows = []
    for count in threads:
        logger.info("%s: measuring at %d thread(s)", model.name, count)
        engines: dict[str, Any] = {"default": run_ours(str(model.path), library, count,
                                                       iterations)}
        libraries = {"default": built}
        tuning = (tunings or {}).get(count, {"skipped": "not tuned"})
        if "configs" in tuning:
            tuned = int8_libraries(tmp, count)["tuned"]
            libraries["tuned"] = build(str(model.path), tuned, Path(tuning["configs"]), count)
            engines["tuned"] = (run_ours(str(model.path), tuned, count, iterations)
                                if "error" not in libraries["tuned"] else libraries["tuned"])
        else:
            engines["tuned"] = {"skipped": "no tuned configs"}
        for peer in ("onnxruntime", "openvino"):
            engines[peer] = run_peer(peer, str(model.path), count, iterations)
        engines["torch"] = {"error": "not measured for int8"}
        rows.append({"model": model.name, "kind": model.kind, "threads": count,
                     "engines": engines, "tuning": tuning, "libraries": libraries})
    return rows
