"""Prefetch hints for weights that come from memory inside a model.

A model's weights are read once per inference and its activations stay in cache between
layers, so inside a model a layer finds its weights in memory (BERT-base's 340 MB, ResNet-50's
100 MB; what a last-level cache keeps of them is evicted by the rest of the model), while a
tuning measurement runs the layer again and again with them in cache. A register tile issuing
two FMAs a cycle cannot hide a miss, and the hardware prefetcher starts late on each stream of
a few kilobytes: BERT-base's 128x768x3072 dense ran 3.94 ms with its weights in cache and 4.94
after a cache flush, the same as inside the model (Emerald Rapids, one core).

The templates hint the weights they will read next (the next reduction block, the next
output-channel group) into L2 while computing on the current ones, one row of the packed
weights per reduction step. Where several tiles reuse the same weights they take turns: tile
``turn`` hints line ``turn % lines`` of each row, so the hints cost one load slot a step.
"""

from __future__ import annotations

from collections.abc import Callable

from schedule_templates.ir.nodes import Const, Expr, Load, Stmt, prefetch

#: floats in one 64-byte cache line
LINE_FLOATS = 16
#: LLVM's locality 2: into L2 and out. Into L1 (3) the hints evicted the block being computed
#: on: 4.70 against 4.42 ms flushed on the dense above
LOCALITY = 2


def row_hints(target: Callable[[Expr], Load], row: int, turn: Expr | None = None,
              turns: int = 1) -> list[Stmt]:
    """Hints covering ``row`` floats at ``target(offset)``: one line, chosen by ``turn``, when
    ``turns`` tiles share the row (enough of them to cover its lines); else every line."""
    lines = -(-row // LINE_FLOATS)
    if turn is not None and turns >= lines:
        return [prefetch(target((turn % lines) * LINE_FLOATS), LOCALITY)]
    return [prefetch(target(Const(line * LINE_FLOATS)), LOCALITY) for line in range(lines)]
