"""Where a model's time goes in our build against onnxruntime or OpenVINO, layer by layer.

    python bench/layer_gap.py MODEL.onnx --library LIB [--peer onnxruntime|openvino]
                              [--threads 1] [--iterations 20] [--top 25]

Our steps are timed one by one (``tuner run --profile``'s way: each step alone, median of the
iterations); onnxruntime's nodes come from its own profiler (``enable_profiling``, each node's
kernel time, median of the second half of the runs), run in a fresh process at the same thread
count. Each onnxruntime node is mapped back to the ONNX nodes it came from (its name, the output
its NCHWc form is named after, or the node a fusion is named after), and each of our steps
lists the ONNX nodes it runs, so a row is one of our steps beside the onnxruntime time of the
same nodes. onnxruntime fuses differently (a Conv may carry the Add and Relu after it; a SiLU
becomes one QuickGelu node), so compare rows, not single nodes; its layout reorders and
anything not mapped are their own rows. Step-by-step times include a Python call per step that
the native program does not pay (about 10-20 us each), and a view step (Reshape, Flatten,
Squeeze) costs a copy here but is an alias of its input's buffer there. Prints JSON: totals,
then the rows with the largest gap (ours - the peer) first.

With ``--peer openvino`` the peer's times come from OpenVINO's own counters (``PERF_COUNT``,
fp32 asked for as in ``bench/zoo_peer.py``; the executed nodes' real time, median of the second
half of the runs): its nodes carry the ONNX node's name, sometimes with a suffix
(``/conv1/Conv/WithoutBiases``), and its ``Reorder`` nodes are its layout transforms.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    _THREADS = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
    os.environ["OMP_NUM_THREADS"] = _THREADS
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import json
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from llvmlite import binding as llvm

from tuner_service.errors import TunerServiceError
from workers.hardware import cpu_facts

HERE = Path(__file__).resolve().parent
#: the peers' layout transforms (onnxruntime's NCHWc transformer's, OpenVINO's), one row each
REORDERS = ("ReorderInput", "ReorderOutput", "Reorder")
PEERS = ("onnxruntime", "openvino")


def ort_node_times(model: Path, threads: int, iterations: int) -> dict[str, Any]:
    """onnxruntime's per-node kernel times (ms, median of the second half of the runs)."""
    import onnxruntime as ort
    from zoo_peer import _ORT_TYPES, seeded_feeds

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        feeds = seeded_feeds([(i.name, list(i.shape), _ORT_TYPES[i.type])
                              for i in session.get_inputs()])
        for _ in range(max(2, iterations)):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    samples: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, str] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        node = name[:-len("_kernel_time")]
        samples[node].append(float(event["dur"]) / 1e3)
        ops[node] = str(event.get("args", {}).get("op_name", "?"))
    return {"version": ort.__version__,
            "nodes": {node: {"ms": float(np.median(v[len(v) // 2:])), "op": ops[node]}
                      for node, v in samples.items()}}


def openvino_node_times(model: Path, threads: int, iterations: int) -> dict[str, Any]:
    """OpenVINO's per-node real times (ms, median of the second half of the runs)."""
    import openvino as ov
    from zoo_peer import seeded_feeds

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(model)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
        "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True})
    feeds = seeded_feeds([(port.any_name, list(port.get_shape()),
                           port.get_element_type().to_dtype()) for port in compiled.inputs])
    request = compiled.create_infer_request()
    samples: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, str] = {}
    for _ in range(max(2, iterations)):
        request.infer(feeds)
        for info in request.profiling_info:
            if info.status != info.Status.EXECUTED:
                continue
            samples[info.node_name].append(info.real_time.total_seconds() * 1e3)
            ops[info.node_name] = info.node_type
    return {"version": ov.get_version(),
            "nodes": {node: {"ms": float(np.median(v[len(v) // 2:])), "op": ops[node]}
                      for node, v in samples.items()}}


def onnx_node_of(ort_name: str, names: set[str], producers: Mapping[str, str]) -> str | None:
    """The ONNX node an onnxruntime node stands for (None when it cannot be told)."""
    if ort_name in names:
        return ort_name
    stem = ort_name.removesuffix("_nchwc")
    if stem in producers:
        return producers[stem]
    # fusions are named after a node: "<node>/QuickGeluFusion/", "<node>_token_3", ...
    return max((n for n in names if ort_name.startswith(n)), key=len, default=None)


def our_steps(model: Path, library: Path, threads: int, iterations: int
              ) -> list[dict[str, Any]]:
    """Our steps in graph order: name, kind, median ms and the ONNX nodes each runs."""
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.loader import KernelLibrary, read_manifest

    manifest = read_manifest(library)
    nodes_of = {str(layer["name"]): [str(n) for n in layer.get("nodes", [layer["name"]])]
                for key in ("layers", "generated_layers")
                for layer in manifest.get(key, [])}
    runner = ModelRunner(model.read_bytes(), KernelLibrary(library), threads)
    feeds = runner.random_feeds(0)
    runner.run(feeds)
    rows = []
    for timed in runner.profile(feeds, iterations):
        name = str(timed["step"])
        layer = name.split(" [", 1)[0].split(" (", 1)[0]
        rows.append({"step": name, "kind": timed["kind"], "ms": 1e3 * float(timed["median_s"]),
                     "nodes": nodes_of.get(layer, [layer])})
    return rows


def compare(model_proto: onnx.ModelProto, ours: list[dict[str, Any]],
            ort_nodes: Mapping[str, Mapping[str, Any]], peer: str = "onnxruntime"
            ) -> dict[str, Any]:
    """Rows of (our step, the peer's ms of the same ONNX nodes), plus the unmapped rest."""
    graph = model_proto.graph
    names = {n.name for n in graph.node if n.name}
    producers = {out: n.name for n in graph.node for out in n.output if n.name}
    ort_by_node: dict[str, float] = defaultdict(float)
    extra: dict[str, float] = defaultdict(float)
    for ort_name, entry in ort_nodes.items():
        if entry["op"] in REORDERS:
            extra[f"{peer} layout reorders"] += entry["ms"]
            continue
        node = onnx_node_of(ort_name, names, producers)
        if node is None:
            extra[f"{peer} unmapped {entry['op']}"] += entry["ms"]
        else:
            ort_by_node[node] += entry["ms"]
    rows, claimed = [], set()
    for step in ours:
        mine = [n for n in step["nodes"] if n not in claimed]
        claimed.update(mine)
        peer_ms = sum(ort_by_node.get(n, 0.0) for n in mine)
        rows.append({"step": step["step"], "kind": step["kind"], "ours_ms": step["ms"],
                     "peer_ms": peer_ms, "gap_ms": step["ms"] - peer_ms})
    for node, ms in ort_by_node.items():
        if node not in claimed:
            extra[f"{peer} node not in our steps: {node}"] += ms
    rows += [{"step": name, "kind": f"{peer} only", "ours_ms": 0.0, "peer_ms": ms,
              "gap_ms": -ms} for name, ms in extra.items()]
    by_kind: dict[str, dict[str, float]] = defaultdict(lambda: {"ours_ms": 0.0, "peer_ms": 0.0})
    for row in rows:
        by_kind[row["kind"]]["ours_ms"] += row["ours_ms"]
        by_kind[row["kind"]]["peer_ms"] += row["peer_ms"]
    return {"ours_ms": sum(r["ours_ms"] for r in rows), "peer_ms": sum(r["peer_ms"] for r in rows),
            "by_kind": dict(by_kind), "rows": sorted(rows, key=lambda r: -r["gap_ms"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, metavar="MODEL.onnx")
    parser.add_argument("--library", type=Path, help="a `tuner build` output directory")
    parser.add_argument("--peer", choices=PEERS, default="onnxruntime")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="rows to print (largest gap first)")
    parser.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_only:
        times = ort_node_times if args.peer == "onnxruntime" else openvino_node_times
        print(json.dumps(times(args.model, args.threads, args.iterations)))
        return 0
    if args.library is None:
        parser.error("--library is required")
    try:
        proto = onnx.load(str(args.model))
    except (OSError, DecodeError, ValueError) as e:
        print(f"error: cannot read {args.model}: {e}", file=sys.stderr)
        return 1
    peer = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(args.model), "--peer-only",
         "--peer", args.peer, "--threads", str(args.threads), "--iterations",
         str(args.iterations)], capture_output=True, text=True, check=False)
    if peer.returncode != 0:
        print(f"error: {args.peer}'s profile failed: {peer.stderr.strip()[-2000:]}",
              file=sys.stderr)
        return 1
    ort = json.loads(peer.stdout)
    try:
        ours = our_steps(args.model, args.library, args.threads, args.iterations)
    except TunerServiceError as e:  # not a library, or not this model's
        print(f"error: {e}", file=sys.stderr)
        return 1
    report = compare(proto, ours, ort["nodes"], args.peer)
    report["rows"] = report["rows"][:max(0, args.top)]
    out = {"model": str(args.model), "library": str(args.library), "threads": args.threads,
           "iterations": args.iterations, "cpu": cpu_facts()["cpu_model"],
           "llvm_cpu": llvm.get_host_cpu_name(),
           "peer": args.peer, args.peer: ort["version"], **report}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
