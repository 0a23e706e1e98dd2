"""``tuner extract`` and ``tuner sample-model``: the ONNX frontend from the command line.

onnx is imported inside the handlers only, so ``tuner --help`` and worker-only installs work
without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner_service.compiler.frontend.samples import SAMPLE_MODELS

if TYPE_CHECKING:
    from tuner_service.compiler.frontend.extract import ExtractionResult

logger = logging.getLogger(__name__)

# Exit status for a model we cannot read or use (argparse also uses 2 for bad usage).
EXIT_BAD_MODEL = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    extract = subparsers.add_parser(
        "extract",
        help="list the tuning tasks of an ONNX model",
        description="Extract tunable layers (conv2d, depthwise_conv2d, group_conv2d, dense, "
        "batch_matmul) from an ONNX model, merged by identical workload.",
    )
    extract.add_argument("model", type=Path, metavar="MODEL.onnx")
    add_input_shape_flag(extract)
    extract.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                         help="the tasks of a `tuner build --precision` library (bf16: the "
                         "dense_bf16 and conv2d_bf16 keys to tune with `tuner tune KEY`); "
                         "default fp32")
    add_layout_flags(extract, "the tasks of")
    add_int8_flag(extract, "the tasks of a library with")
    extract.add_argument("--json", action="store_true", help="print JSON instead of a table")
    extract.set_defaults(func=run_extract)

    sample = subparsers.add_parser(
        "sample-model",
        help="write a built-in sample ONNX model",
        description="Build a sample model in code (random weights, fixed seed) and save it.",
    )
    sample.add_argument("name", choices=SAMPLE_MODELS)
    sample.add_argument("-o", "--output", type=Path, required=True, metavar="FILE")
    sample.set_defaults(func=run_sample_model)


def add_input_shape_flag(parser: argparse.ArgumentParser) -> None:
    """``--input-shape NAME=DIMS``, repeatable (extract, build, run, submit)."""
    parser.add_argument(
        "--input-shape", action="append", default=[], metavar="NAME=DIMS",
        help="pin a dynamic input's shape, e.g. input_ids=1x128 (repeat for each input)")


def add_layout_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--layout nchw|nchwc|auto`` (default nchw) and ``--block`` (extract, submit): which
    library plan's tasks ``what`` names."""
    parser.add_argument("--layout", choices=("nchw", "nchwc", "auto"), default="nchw",
                        help=f"{what} a `tuner build --layout` library: nchw (the default), "
                        "nchwc (conv layers as blocked workloads) or auto (both)")
    parser.add_argument("--block", type=int, default=None,
                        help="channel block of nchwc/auto: the vector width in floats of the "
                        "CPU that runs the library (8 AVX2, 16 AVX-512; default: this CPU's)")


def add_int8_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--int8 auto|exact|sat16`` (build, extract): how a quantized model's int8 layers sum
    their products (``frontend.int8_arithmetic``)."""
    parser.add_argument("--int8", choices=("auto", "exact", "sat16"), default="auto",
                        help=f"{what} int8 layers summing u8 x s8 products exactly (exact) or "
                        "in saturating 16-bit pairs as onnxruntime does on CPUs without VNNI "
                        "(sat16, faster there); auto: onnxruntime's arithmetic on this CPU "
                        "(default)")


def input_shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]] | None:
    """The parsed ``--input-shape`` flags (None if there are none); ModelError if malformed."""
    items = getattr(args, "input_shape", None) or []
    if not items:
        return None
    from tuner_service.compiler.frontend.shapes import parse_input_shapes

    return parse_input_shapes(items)


def run_extract(args: argparse.Namespace) -> int:
    from tuner_service.compiler.frontend.errors import ModelError
    from tuner_service.compiler.frontend.extract import extract_tasks

    if not args.model.is_file():
        print(f"error: cannot read {args.model}: no such file", file=sys.stderr)
        return EXIT_BAD_MODEL
    try:
        # a path, not bytes: external data files are read from the model's folder
        result = extract_tasks(args.model, input_shapes(args), precision=args.precision,
                               layout=args.layout, block=_block(args), int8=args.int8)
    except ModelError as e:
        print(f"error: {args.model}: {e}", file=sys.stderr)
        return EXIT_BAD_MODEL
    if args.json:
        print(json.dumps(result_to_json(result), indent=2))
    else:
        print(format_table(result))
    return 0


def _block(args: argparse.Namespace) -> int | None:
    if args.layout == "nchw" or args.block is not None:
        return int(args.block) if args.block is not None else None
    from tuner_service.compiler.deploy.layout import host_block

    return host_block()


def run_sample_model(args: argparse.Namespace) -> int:
    from tuner_service.compiler.frontend.samples import sample_model_bytes

    data = sample_model_bytes(args.name)
    try:
        args.output.write_bytes(data)
    except OSError as e:
        print(f"error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {args.name} ({len(data) / 1e6:.1f} MB) to {args.output}")
    return 0


def result_to_json(result: ExtractionResult) -> dict[str, Any]:
    """The JSON form other tools read; field names are fixed."""
    return {
        "tasks": [
            {
                "workload": task.workload.key,
                "weight": task.weight,
                "flops": task.workload.flops(),
                "description": task.workload.describe(),
            }
            for task in result.tasks
        ],
        "unsupported": [
            {"op": u.op, "node": u.node, "reason": u.reason} for u in result.unsupported
        ],
    }


def format_table(result: ExtractionResult) -> str:
    """Tasks as aligned columns, then a total and the layers that will not be tuned."""
    header = ("workload", "key", "weight", "GFLOP")
    rows = [
        (t.workload.describe(), t.workload.key, str(t.weight), f"{t.workload.flops() / 1e9:.3f}")
        for t in result.tasks
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [_row(header, widths), _row(tuple("-" * w for w in widths), widths)]
    lines += [_row(row, widths) for row in rows]
    lines.append(
        f"{len(result.tasks)} tasks, {result.total_flops() / 1e9:.3f} GFLOP per inference "
        "in tunable layers (GFLOP column: one call)"
    )
    if result.unsupported:
        lines.append(f"{len(result.unsupported)} layers will not be tuned:")
        lines += [f"  {u.op} {u.node}: {u.reason}" for u in result.unsupported]
    return "\n".join(lines)


def _row(cells: tuple[str, ...], widths: list[int]) -> str:
    # Text columns left-aligned, numbers (the last two) right-aligned.
    text = [cell.ljust(w) for cell, w in zip(cells[:2], widths[:2], strict=True)]
    numbers = [cell.rjust(w) for cell, w in zip(cells[2:], widths[2:], strict=True)]
    return "  ".join(text + numbers).rstrip()
