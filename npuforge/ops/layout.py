"""Ops that replicate or rearrange elements: Expand, Tile, DepthToSpace,
SpaceToDepth, ReverseSequence.

They only move values, so a quantized input keeps its parameters through them
("passthrough"); Expand and Tile also propagate symbolic shape values.
"""

import numpy as np
import torch

from .dtype_rules import require_dtype
from .registry import (
    REQUIRED, Op, Structural, TensorInfo, broadcast_shapes, const_ints, dim_product, dim_quotient, fail,
    register, unsupported,
)


@register
class Expand(Structural):
    name = "Expand"
    inputs = (2, 2)
    summary = "broadcast to a shape known at import (numpy rules: the larger of each dim pair)"
    quant = "passthrough"

    def infer(self, node, ins):
        x, shape = ins
        require_dtype(node, shape, ("int64",), "shape")
        target = const_ints(node, shape, "the shape")
        if any(isinstance(d, int) and d < 0 for d in target):
            fail(node, f"shape {target} has a negative dim")
        return [TensorInfo(x.dtype, broadcast_shapes(node, x.shape, tuple(target)))]

    def np_forward(self, node, values, outs):
        if any(isinstance(d, str) for d in outs[0].shape):
            return None
        return [np.broadcast_to(values[0], outs[0].shape).copy()]

    def forward(self, node, xs):
        x, shape = xs
        target = torch.broadcast_shapes(tuple(x.shape), tuple(int(d) for d in shape.tolist()))
        return [x.expand(target).contiguous()]


@register
class Tile(Structural):
    name = "Tile"
    inputs = (2, 2)
    summary = "repeat the input along each axis by repeats (known at import)"
    quant = "passthrough"

    def repeats(self, node, ins) -> list:
        x, reps = ins
        require_dtype(node, reps, ("int64",), "repeats")
        repeats = const_ints(node, reps, "repeats")
        if len(repeats) != len(x.shape):
            fail(node, f"repeats {repeats} should have one entry per input axis ({len(x.shape)})")
        if any(not isinstance(r, int) or r < 0 for r in repeats):
            unsupported(node, f"repeats {repeats} must be non-negative integers known at import")
        return repeats

    def infer(self, node, ins):
        x = ins[0]
        shape = tuple(d if r == 1 else dim_product([d, r]) for d, r in zip(x.shape, self.repeats(node, ins)))
        return [TensorInfo(x.dtype, shape)]

    def np_forward(self, node, values, outs):
        return [np.tile(values[0], [int(r) for r in values[1].reshape(-1)])]

    def forward(self, node, xs):
        x, reps = xs
        return [x.repeat([int(r) for r in reps.tolist()])]


class _BlockLayout(Op):
    attrs = {"blocksize": REQUIRED}
    quant = "passthrough"

    def block(self, node, x) -> int:
        if len(x.shape) != 4:
            fail(node, f"input rank {len(x.shape)}: expected [N, C, H, W]")
        b = node.attrs["blocksize"]
        if b < 1:
            fail(node, f"blocksize {b} is not positive")
        return b


@register
class DepthToSpace(_BlockLayout):
    name = "DepthToSpace"
    attrs = {"blocksize": REQUIRED, "mode": "DCR"}
    summary = "move channel blocks into blocksize x blocksize spatial tiles (DCR or CRD order)"

    def from_onnx(self, ctx, node):
        if node.attrs["mode"] not in ("DCR", "CRD"):
            fail(node, f"mode {node.attrs['mode']!r} is not DCR or CRD")

    def infer(self, node, ins):
        x = ins[0]
        b = self.block(node, x)
        n, c, h, w = x.shape
        return [TensorInfo(x.dtype, (n, dim_quotient(node, c, b * b), dim_product([h, b]), dim_product([w, b])))]

    def forward(self, node, xs):
        x = xs[0]
        b = node.attrs["blocksize"]
        n, c, h, w = x.shape
        if node.attrs["mode"] == "DCR":  # channels are (block row, block column, depth)
            y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
        else:  # CRD: (depth, block row, block column)
            y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
        return [y.reshape(n, c // (b * b), h * b, w * b)]


@register
class SpaceToDepth(_BlockLayout):
    name = "SpaceToDepth"
    summary = "move blocksize x blocksize spatial tiles into channels (the inverse of DepthToSpace DCR)"

    def infer(self, node, ins):
        x = ins[0]
        b = self.block(node, x)
        n, c, h, w = x.shape
        return [TensorInfo(x.dtype, (n, dim_product([c, b * b]), dim_quotient(node, h, b), dim_quotient(node, w, b)))]

    def forward(self, node, xs):
        x = xs[0]
        b = node.attrs["blocksize"]
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
        return [y.reshape(n, c * b * b, h // b, w // b)]


@register
class ReverseSequence(Op):
    name = "ReverseSequence"
    inputs = (2, 2)
    attrs = {"batch_axis": 1, "time_axis": 0}
    summary = "reverse the first sequence_lens[b] steps along the time axis, for each batch entry b"
    quant = "passthrough"

    def infer(self, node, ins):
        x, lens = ins
        a = node.attrs
        if len(x.shape) < 2:
            fail(node, f"input rank {len(x.shape)}: expected at least [time, batch]")
        if sorted((a["batch_axis"], a["time_axis"])) != [0, 1]:
            fail(node, f"batch_axis {a['batch_axis']} and time_axis {a['time_axis']} must be 0 and 1")
        require_dtype(node, lens, ("int64",), "sequence_lens")
        batch = x.shape[a["batch_axis"]]
        if len(lens.shape) != 1 or (isinstance(batch, int) and lens.shape[0] != batch):
            fail(node, f"sequence_lens shape {list(lens.shape)} should be [{batch}]")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x, lens = xs
        t_axis = node.attrs["time_axis"]
        steps = x.shape[t_axis]
        t = torch.arange(steps).unsqueeze(1)  # [time, 1]
        n = lens.to(torch.int64).unsqueeze(0)  # [1, batch]
        src = torch.where(t < n, n - 1 - t, t)  # [time, batch]: the step each output step reads
        if t_axis == 1:
            src = src.T
        src = src.reshape(src.shape + (1,) * (x.dim() - 2)).expand(x.shape)
        return [torch.gather(x, t_axis, src)]
