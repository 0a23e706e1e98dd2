"""x86 template for ``group_conv2d_nchwc``: the blocked direct convolution over each tile's own
groups.

The kernel is ``conv2d_nchwc.x86``'s (register tiles of ``oh_t x ow_t`` pixels by ``kb_t``
output blocks, a broadcast activation times ``kb_t`` weight vectors per reduction step, whole
vectors stored), except that a tile reduces over the ``span`` input blocks its groups read
(``GroupWindow``) instead of all of them. The weights are packed once as
``[K/b/kbt][span][R][S][b][kbt][b]`` with zeros where an input lane belongs to another group.

The space keeps the tile heights and widths of the dense template; ``tile_kb`` takes only the
block counts whose tiles meet group boundaries. The default takes the tile with the fewest
wasted multiply-adds (one block a tile for groups narrower than a block), then the widest.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.errors import InvalidConfigError
from schedule_templates.ir.nodes import Expr, Kernel
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.choose import largest_divisor
from schedule_templates.templates.epilogue import epilogue_arguments
from schedule_templates.templates.x86_conv2d_nchwc import (
    Conv2dNCHWcX86,
    _accumulators,
    blocked_conv_kernel,
)
from schedule_templates.templates.x86_nchwc_window import balanced_width
from schedule_templates.workloads import Conv2dNCHWc, GroupConv2dNCHWc, Workload
from schedule_templates.workloads.group_nchwc import GroupWindow


def _window(wl: GroupConv2dNCHWc, kbt: int) -> GroupWindow:
    window = wl.window(kbt)
    if window is None:  # the space's constraint keeps such tiles out
        raise InvalidConfigError(f"{wl.key}: tiles of {kbt} blocks do not meet group "
                                 "boundaries")
    return window


@register
class GroupConv2dNCHWcX86(Template):
    name = "group_conv2d_nchwc.x86"
    op = "group_conv2d_nchwc"
    target_kind = "llvm"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, GroupConv2dNCHWc)
        dense = Conv2dNCHWcX86().space(_dense_twin(wl), device)
        fits = dense.constraint

        def aligned(cfg: Config) -> bool:
            return wl.window(cfg["tile_kb"][1]) is not None and (fits is None or fits(cfg))

        return ConfigSpace(dense.knobs, constraint=aligned)

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, GroupConv2dNCHWc)
        options = [kbt for kbt in (3, 2, 1) if wl.window(kbt) is not None]
        kbt = min(options, key=lambda k: (_window(wl, k).redundancy(wl.block, wl.group_in), -k))
        pixels = _accumulators(wl.block, kbt) // kbt
        owt = balanced_width(wl.out_w, pixels)
        oht = largest_divisor(wl.out_h, max(1, pixels // owt))
        return self.space(wl).from_entities({
            "tile_kb": (wl.blocks_out // kbt, kbt),
            "tile_oh": (wl.out_h // oht, oht),
            "ow_t": owt,
            "outer_order": "k_h",
            "unroll_s": "unroll" if wl.S <= 3 else "none",
            "unroll_c": "none",
        })

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, GroupConv2dNCHWc)
        window = _window(wl, config["tile_kb"][1])

        def first(tile: Expr) -> Expr:
            return (tile // window.tiles_per_step) * window.step

        return blocked_conv_kernel(wl, config, "group_conv2d_nchwc_x86", window.span, first)

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = as_workload(workload, GroupConv2dNCHWc)
        kbt = config["tile_kb"][1]
        return {"data": inputs["data"],
                "weight_packed": pack_grouped_weight(wl, inputs["weight"], kbt),
                **epilogue_arguments(wl, inputs)}


def _dense_twin(wl: GroupConv2dNCHWc) -> Workload:
    """The ungrouped blocked convolution of the same shape (whose space this one narrows)."""
    return Conv2dNCHWc(wl.N, wl.C, wl.H, wl.W, wl.R, wl.S, wl.stride, wl.pad, wl.dilation,
                       block=wl.block, K=wl.K)


def pack_grouped_weight(wl: GroupConv2dNCHWc, weight: np.ndarray, kbt: int) -> np.ndarray:
    """``[K][C/groups][R][S]`` -> ``[K/b/kbt][span][R][S][b (input)][kbt][b (output)]``: each
    tile's input blocks, zero where an input channel is not in the output channel's group (and
    for padded channels)."""
    w = np.asarray(weight, dtype=np.float32)
    b, window = wl.block, _window(wl, kbt)
    cg, kg = wl.group_in, wl.K // wl.groups
    full = np.zeros((wl.blocks_out * b, wl.blocks_in * b, wl.R, wl.S), dtype=np.float32)
    for g in range(wl.groups):
        full[g * kg:(g + 1) * kg, g * cg:(g + 1) * cg] = w[g * kg:(g + 1) * kg]
    tiles = wl.blocks_out // kbt
    packed = np.empty((tiles, window.span, wl.R, wl.S, b, kbt, b), dtype=np.float32)
    for t in range(tiles):
        first = window.start(t) * b
        part = full[t * kbt * b:(t + 1) * kbt * b, first:first + window.span * b]
        # (kbt, bk, span, bc, r, s) -> (span, r, s, bc, kbt, bk)
        split = part.reshape(kbt, b, window.span, b, wl.R, wl.S)
        packed[t] = split.transpose(2, 4, 5, 3, 0, 1)
    return packed
