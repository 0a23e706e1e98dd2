"""Export one zoo model to ONNX. Runs in the exporter environment (.venv-zoo, scripts/zoo_env.sh),
not in the project's .venv: PyPI's torchvision needs the torch it was built against.

    .venv-zoo/bin/python bench/zoo_export.py MODEL EXPORTER OUT_DIR

EXPORTER: ``torchscript`` (torch.onnx.export(dynamo=False)) or ``dynamo`` (dynamo=True, its
defaults: weights in an external-data file beside the model, as users get them). Writes
OUT_DIR/model.onnx (plus data files) and OUT_DIR/export.json; prints that JSON. Random weights
(fixed seed), batch 1, fp32, eval mode; every all-zero parameter or buffer (biases, batch-norm
running means, ViT's zero-initialised head) is re-drawn so that output checks are not vacuous.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds modules (kernels.py, ...) named like packages transformers probes for: keep this
# script's folder off the import path
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

SEED = 0
#: zoo name -> torchvision.models builder name, input resolution
TORCHVISION = {
    "resnet50": ("resnet50", 224),
    "mobilenet_v3_large": ("mobilenet_v3_large", 224),
    "efficientnet_b0": ("efficientnet_b0", 224),
    "densenet121": ("densenet121", 224),
    "shufflenet_v2_x1_0": ("shufflenet_v2_x1_0", 224),
    "regnet_y_400mf": ("regnet_y_400mf", 224),
    "convnext_tiny": ("convnext_tiny", 224),
    "vit_b_16": ("vit_b_16", 224),
    "squeezenet1_1": ("squeezenet1_1", 224),
}
BERT_SEQUENCE = 128


def randomize(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Re-draw all-zero tensors and batch-norm statistics (fresh ones are 0 and 1)."""
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if not tensor.is_floating_point():
                continue
            if name.endswith("running_var"):
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
            elif name.endswith("running_mean") or not bool(tensor.any()):
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.05)


def torchvision_model(name: str) -> tuple[torch.nn.Module, tuple[Any, ...], list[str]]:
    import torchvision

    builder, size = TORCHVISION[name]
    model = getattr(torchvision.models, builder)(weights=None)
    return model, (torch.randn(1, 3, size, size),), ["input"]


def bert_model() -> tuple[torch.nn.Module, tuple[Any, ...], list[str]]:
    import transformers

    config = transformers.BertConfig(attn_implementation="eager")  # bert-base sizes
    model = transformers.BertModel(config)
    ids = torch.randint(0, config.vocab_size, (1, BERT_SEQUENCE))
    mask = torch.ones(1, BERT_SEQUENCE, dtype=torch.int64)
    segments = torch.zeros(1, BERT_SEQUENCE, dtype=torch.int64)
    return _TupleOutputs(model), (ids, mask, segments), [
        "input_ids", "attention_mask", "token_type_ids"]


class _TupleOutputs(torch.nn.Module):
    """A transformers model returning plain tensors (both exporters take those)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, segments: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.inner(input_ids=ids, attention_mask=mask, token_type_ids=segments)
        return out.last_hidden_state, out.pooler_output


def build(name: str) -> tuple[torch.nn.Module, tuple[Any, ...], list[str]]:
    if name == "bert_base":
        return bert_model()
    if name in TORCHVISION:
        return torchvision_model(name)
    raise SystemExit(f"unknown zoo model {name!r}")


def export(model: torch.nn.Module, args: tuple[Any, ...], names: list[str], exporter: str,
           path: Path) -> None:
    if exporter == "torchscript":
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17,
                          input_names=names, do_constant_folding=True)
    elif exporter == "dynamo":
        # as users call it: export(..., f, dynamo=True) writes the weights to an external
        # data file beside the model (its external_data=True default)
        torch.onnx.export(model, args, str(path), dynamo=True, input_names=names)
    else:
        raise SystemExit(f"unknown exporter {exporter!r}")


def main() -> None:
    name, exporter, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    report: dict[str, Any] = {"model": name, "exporter": exporter,
                              "torch": torch.__version__}
    started = time.perf_counter()
    try:
        model, args, names = build(name)
        randomize(model, generator)
        model.eval()
        # not under no_grad: there torch.nn.MultiheadAttention takes its fused fast path
        # (aten::_native_multi_head_attention), which the TorchScript exporter cannot write
        _quiet(lambda: export(model, args, names, exporter, out / "model.onnx"))
        report.update(ok=True, files=sorted(p.name for p in out.iterdir()))
    except Exception as e:  # an exporter failure is a result of the zoo, not a crash of it
        report.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        (out / "export-error.txt").write_text(traceback.format_exc())
    report["seconds"] = round(time.perf_counter() - started, 1)
    (out / "export.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


def _quiet(fn: Callable[[], None]) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn()


if __name__ == "__main__":
    main()
