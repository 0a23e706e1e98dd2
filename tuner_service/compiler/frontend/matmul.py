"""Map ONNX ``Gemm`` and ``MatMul`` nodes to ``dense`` or ``batch_matmul`` workloads.

``dense`` needs a constant weight (templates pack it once, transposing it if the model stores
it as K x N), so a product with a constant right operand is dense and a product of two
activations is ``batch_matmul``. Leading dimensions of an activation times a matrix fold into M.
"""

from __future__ import annotations

import logging
import math

import onnx

from schedule_templates.workloads import Workload, make_workload
from tuner_service.compiler.frontend.attributes import attr_float, attr_int
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.graph import GraphIndex

logger = logging.getLogger(__name__)


def map_gemm(node: onnx.NodeProto, graph: GraphIndex) -> Workload:
    """``Y = alpha * A' . B' + beta * C``; the bias and beta are an epilogue, not tuned."""
    a, b = node.input[0], node.input[1]
    graph.require_float32(a, "input A")
    a_shape = graph.static_shape(a, "input A")
    b_shape = graph.static_shape(b, "input B")
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise UnmappableNode(f"Gemm operands must be matrices, got {a_shape} and {b_shape}")
    if attr_int(node, "transA", 0):
        raise UnmappableNode("transA=1 (activation stored transposed) has no template")
    m, k = a_shape
    trans_b = bool(attr_int(node, "transB", 0))
    n = b_shape[0] if trans_b else b_shape[1]
    if graph.is_constant(b):
        # alpha folds into the constant weight when it is packed.
        return make_workload("dense", M=m, N=n, K=k)
    if trans_b:
        raise UnmappableNode("Gemm with transB=1 on a non-constant B has no template")
    if attr_float(node, "alpha", 1.0) != 1.0:
        raise UnmappableNode("Gemm of two activations with alpha != 1 has no template")
    return make_workload("batch_matmul", B=1, M=m, N=n, K=k)


def map_matmul(node: onnx.NodeProto, graph: GraphIndex) -> Workload:
    """numpy-style matmul: 1-D operands are promoted, batch dimensions broadcast."""
    a, b = node.input[0], node.input[1]
    graph.require_float32(a, "input A")
    a_shape = graph.static_shape(a, "input A")
    b_shape = graph.static_shape(b, "input B")
    # Promote vectors the way ONNX (numpy) does; the product's work is the same.
    a_mat = a_shape if len(a_shape) >= 2 else (1, *a_shape)
    b_mat = b_shape if len(b_shape) >= 2 else (*b_shape, 1)
    m, k = math.prod(a_mat[:-1]), a_mat[-1]
    n = b_mat[-1]
    if b_mat[-2] != k:
        raise UnmappableNode(f"inner dimensions differ: {a_shape} x {b_shape}")
    if graph.is_constant(b) and len(b_mat) == 2:
        return make_workload("dense", M=m, N=n, K=k)
    return _batched(a_mat, b_mat)


def _batched(a: tuple[int, ...], b: tuple[int, ...]) -> Workload:
    """Flatten batch dimensions to B; broadcasting that would need a copy is refused."""
    m, k, n = a[-2], a[-1], b[-1]
    batch_a, batch_b = a[:-2], b[:-2]
    if math.prod(batch_b) == 1:
        # One right-hand matrix shared by every batch: rows of all batches stack into M.
        return make_workload("batch_matmul", B=1, M=math.prod(batch_a) * m, N=n, K=k)
    rank = max(len(batch_a), len(batch_b))
    padded_a = (1,) * (rank - len(batch_a)) + batch_a
    padded_b = (1,) * (rank - len(batch_b)) + batch_b
    if padded_a != padded_b:
        raise UnmappableNode(
            f"batch dimensions {batch_a} and {batch_b} broadcast; batch_matmul needs equal batches"
        )
    return make_workload("batch_matmul", B=math.prod(batch_a), M=m, N=n, K=k)
