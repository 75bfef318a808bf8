"""Normalizations: BatchNormalization (inference mode), LayerNormalization,
InstanceNormalization, GroupNormalization, LRN, MeanVarianceNormalization,
LpNormalization.

LayerNormalization and GroupNormalization compute their first stage (mean,
variance, the normalized value) in float32 whatever the input's float type:
stash_type 1, as the ONNX function bodies cast; scale and bias then apply in
the input's type.
"""

import numpy as np
import torch
import torch.nn.functional as F

from .dtype_rules import FLOAT, require_dtype
from .registry import (
    REQUIRED, Op, TensorInfo, broadcast_shapes, fail, norm_axis, register, static_dims, unsupported,
)


def _per_channel_params(node, x, params, names) -> None:
    """Check that each of ``params`` is a 1-D tensor of x's dtype with one entry per channel (axis 1)."""
    c = x.shape[1]
    for what, p in zip(names, params):
        if len(p.shape) != 1 or (isinstance(c, int) and p.shape[0] != c):
            fail(node, f"{what} shape {list(p.shape)} should be [{c}]")
        if p.dtype != x.dtype:
            fail(node, f"{what} dtype {p.dtype} differs from the input's {x.dtype}")


def _channel_view(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t.reshape((1, -1) + (1,) * (rank - 2))


def _check_stash_type(node) -> None:
    if node.attrs["stash_type"] != 1:
        unsupported(node, f"stash_type {node.attrs['stash_type']} is not supported (only 1: float32)")


@register
class BatchNormalization(Op):
    name = "BatchNormalization"
    inputs = (5, 5)
    outputs = (1, 3)  # training-mode outputs are rejected at import
    attrs = {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}
    summary = "(x - mean) / sqrt(var + epsilon) * scale + B per channel (axis 1), inference mode"

    def from_onnx(self, ctx, node):
        if node.attrs["training_mode"]:
            unsupported(node, "training_mode=1 is not supported; export the model in eval mode")
        if len([o for o in node.outputs if o]) > 1:
            unsupported(node, "running mean/var outputs (training mode) are not supported")
        node.outputs = node.outputs[:1]

    def infer(self, node, ins):
        x = ins[0]
        if len(x.shape) < 2:
            fail(node, f"input rank {len(x.shape)} has no channel axis")
        c = x.shape[1]
        for what, p in zip(("scale", "B", "mean", "var"), ins[1:]):
            if len(p.shape) != 1 or (isinstance(c, int) and p.shape[0] != c):
                fail(node, f"{what} shape {list(p.shape)} should be [{c}]")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x, scale, bias, mean, var = xs
        view = (1, -1) + (1,) * (x.dim() - 2)
        mul = scale / torch.sqrt(var + node.attrs["epsilon"])
        return [(x - mean.reshape(view)) * mul.reshape(view) + bias.reshape(view)]


class _IntegerNormalization(Op):
    """Normalizations with the exact integer rule of npuforge/quant/layernorm_rule.py
    (quantization kind "layernorm")."""

    quant = "layernorm"

    def _fits(self, node, graph) -> bool:
        from ..errors import NpuforgeError
        from ..quant import layernorm_rule

        try:
            _, n, _ = layernorm_rule._geometry(graph, node)
        except NpuforgeError:  # dynamic normalized axes: no integer rule
            return False
        return layernorm_rule.fits(n)

    def quantize_integers(self, graph, node, add):
        from ..quant.layernorm_rule import quantize_integers

        quantize_integers(graph, node, add)

    def integer_forward(self, sim, node, env):
        from ..quant.layernorm_rule import integer_forward

        return integer_forward(sim, node, env)


@register
class LayerNormalization(_IntegerNormalization):
    name = "LayerNormalization"
    inputs = (2, 3)
    outputs = (1, 3)
    attrs = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}
    summary = ("normalize over the axes from axis on, * Scale + B; float32 Mean / InvStdDev outputs (stash_type 1); "
               "int8: integer mean, variance and square root")
    def quant_kind(self, node, graph):
        # the integer rule needs constant Scale / B, computes only Y, and slices int64 can sum
        params = [i for i in node.inputs[1:] if i]
        ok = len(node.outputs) == 1 and all(graph.values[i].is_const for i in params) and self._fits(node, graph)
        return self.quant if ok else None

    def from_onnx(self, ctx, node):
        _check_stash_type(node)
        for k, out in enumerate(node.outputs):
            if not out:  # Mean omitted but InvStdDev wanted: an unused value keeps the positions
                node.outputs[k] = ctx.graph.unique_name(f"{node.name}_unused{k}")

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        rank = len(x.shape)
        axis = norm_axis(node, node.attrs["axis"], rank)
        normalized = tuple(x.shape[axis:])
        for what, p in zip(("Scale", "B"), ins[1:]):
            if p is None:
                continue
            if p.dtype != x.dtype:
                fail(node, f"{what} dtype {p.dtype} differs from the input's {x.dtype}")
            if len(p.shape) > len(normalized) or broadcast_shapes(node, normalized, p.shape) != normalized:
                fail(node, f"{what} shape {list(p.shape)} does not broadcast to the normalized shape "
                           f"{list(normalized)}")
        stats = TensorInfo("float32", tuple(x.shape[:axis]) + (1,) * (rank - axis))
        return [TensorInfo(x.dtype, x.shape), stats, TensorInfo(stats.dtype, stats.shape)][:len(node.outputs)]

    def forward(self, node, xs):
        x, scale = xs[0], xs[1]
        bias = xs[2] if len(xs) > 2 else None
        dims = tuple(range(node.attrs["axis"] % x.dim(), x.dim()))
        x32 = x.to(torch.float32)
        mean = x32.mean(dim=dims, keepdim=True)
        d = x32 - mean
        inv_std = torch.reciprocal(torch.sqrt((d * d).mean(dim=dims, keepdim=True) + node.attrs["epsilon"]))
        y = (d * inv_std).to(x.dtype) * scale
        if bias is not None:
            y = y + bias
        return [y, mean, inv_std][:len(node.outputs)]


@register
class InstanceNormalization(_IntegerNormalization):
    name = "InstanceNormalization"
    inputs = (3, 3)
    attrs = {"epsilon": 1e-5}
    summary = ("normalize each (sample, channel) over the spatial axes, then * scale + B per channel; "
               "int8: the integer rule of LayerNormalization")
    def quant_kind(self, node, graph):
        ok = all(graph.values[i].is_const for i in node.inputs[1:]) and self._fits(node, graph)
        return self.quant if ok else None

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        if len(x.shape) < 3:
            fail(node, f"input rank {len(x.shape)}: expected [N, C, spatial...]")
        _per_channel_params(node, x, ins[1:], ("scale", "B"))
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x, scale, bias = xs
        dims = tuple(range(2, x.dim()))
        d = x - x.mean(dim=dims, keepdim=True)
        var = (d * d).mean(dim=dims, keepdim=True)
        y = d / torch.sqrt(var + node.attrs["epsilon"])
        return [y * _channel_view(scale, x.dim()) + _channel_view(bias, x.dim())]


@register
class GroupNormalization(Op):
    name = "GroupNormalization"
    inputs = (3, 3)
    attrs = {"epsilon": 1e-5, "num_groups": REQUIRED, "stash_type": 1}
    summary = "normalize channel groups over themselves and the spatial axes, * scale + B per channel (opset 21)"

    def from_onnx(self, ctx, node):
        _check_stash_type(node)
        if ctx.opset >= 21:
            return
        # Opsets 18-20 give scale and B per group; the IR holds the opset 21 form, one per channel.
        x = ctx.info(node.inputs[0])
        groups = node.attrs["num_groups"]
        if len(x.shape) < 2:
            fail(node, f"input rank {len(x.shape)} has no channel axis")
        c = static_dims(node, x.shape[1:2], "the channel")[0]
        if groups <= 0 or c % groups:
            fail(node, f"{c} channels do not split into {groups} groups")
        for k, what in ((1, "scale"), (2, "B")):
            p = ctx.info(node.inputs[k])
            if p.value is None:
                unsupported(node, f"opset {ctx.opset} gives {what} per group; it must be a constant to be "
                                  f"spread per channel (opset 21 form)")
            if p.value.shape != (groups,):
                fail(node, f"{what} shape {list(p.value.shape)} should be [{groups}] (one per group)")
            node.inputs[k] = ctx.add_const(f"{node.name}_{what}", np.repeat(p.value, c // groups))

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        if len(x.shape) < 3:
            fail(node, f"input rank {len(x.shape)}: expected [N, C, spatial...]")
        groups = node.attrs["num_groups"]
        c = x.shape[1]
        if groups <= 0 or (isinstance(c, int) and c % groups):
            fail(node, f"{c} channels do not split into {groups} groups")
        _per_channel_params(node, x, ins[1:], ("scale", "B"))
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x, scale, bias = xs
        groups = node.attrs["num_groups"]
        g = x.to(torch.float32).reshape(x.shape[0], groups, -1)
        d = g - g.mean(dim=-1, keepdim=True)
        var = (d * d).mean(dim=-1, keepdim=True)
        y = (d / torch.sqrt(var + node.attrs["epsilon"])).reshape(x.shape).to(x.dtype)
        return [y * _channel_view(scale, x.dim()) + _channel_view(bias, x.dim())]


@register
class LRN(Op):
    name = "LRN"
    attrs = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": REQUIRED}
    summary = "x / (bias + alpha / size * sum of x^2 over a window of size channels) ^ beta"

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        if len(x.shape) < 3:
            fail(node, f"input rank {len(x.shape)}: expected [N, C, spatial...]")
        if node.attrs["size"] < 1:
            fail(node, f"size {node.attrs['size']} is not positive")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x = xs[0]
        a = node.attrs
        size = a["size"]
        # ONNX's window: floor((size-1)/2) channels before, ceil((size-1)/2) after
        # (torch's local_response_norm puts the larger half before, for even sizes)
        before = (size - 1) // 2
        sq = F.pad((x * x).movedim(1, -1), (before, size - 1 - before)).movedim(-1, 1)
        square_sum = sq.unfold(1, size, 1).sum(dim=-1)
        return [x / (a["bias"] + a["alpha"] / size * square_sum) ** a["beta"]]


@register
class MeanVarianceNormalization(Op):
    name = "MeanVarianceNormalization"
    attrs = {"axes": [0, 2, 3]}
    summary = "(x - mean) / (std + 1e-9) over the given axes"

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        axes = [norm_axis(node, a, len(x.shape)) for a in node.attrs["axes"]]
        if len(set(axes)) != len(axes):
            fail(node, f"axes {node.attrs['axes']} repeat")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x = xs[0]
        axes = [a % x.dim() for a in node.attrs["axes"]]
        d = x - x.mean(dim=axes, keepdim=True)
        std = torch.sqrt((d * d).mean(dim=axes, keepdim=True))
        return [d / (std + 1e-9)]  # the epsilon of the ONNX function body


@register
class LpNormalization(Op):
    name = "LpNormalization"
    attrs = {"axis": -1, "p": 2}
    summary = "x / ||x||_p along one axis, p = 1 or 2"

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        norm_axis(node, node.attrs["axis"], len(x.shape))
        if node.attrs["p"] not in (1, 2):
            fail(node, f"p {node.attrs['p']} is not 1 or 2")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x = xs[0]
        axis = node.attrs["axis"]
        if node.attrs["p"] == 1:
            return [x / x.abs().sum(dim=axis, keepdim=True)]
        return [x / torch.sqrt((x * x).sum(dim=axis, keepdim=True))]


@register
class L2Normalize(_IntegerNormalization):
    """``F.normalize(x, dim=axes)``, recognised from ReduceL2 -> Clip(min=eps) -> Div by the
    ``recognize_normalizations`` pass, so that it quantizes as one integer rule (the
    division of two activations it is made of has none)."""

    name = "L2Normalize"
    attrs = {"axes": REQUIRED, "epsilon": 0.0}
    summary = ("x / max(||x||_2 over axes, epsilon) (npuforge op, recognised from ReduceL2, Clip, Div); "
               "int8: the integer rule of LayerNormalization without the centring")

    def quant_kind(self, node, graph):
        return self.quant if self._fits(node, graph) else None

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        axes = [norm_axis(node, a, len(x.shape)) for a in node.attrs["axes"]]
        if not axes or len(set(axes)) != len(axes):
            fail(node, f"axes {node.attrs['axes']} must be distinct and not empty")
        if node.attrs["epsilon"] < 0:
            fail(node, f"epsilon {node.attrs['epsilon']} is negative")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x = xs[0]
        dims = [a % x.dim() for a in node.attrs["axes"]]
        norm = torch.sqrt((x * x).sum(dim=dims, keepdim=True))
        return [x / torch.clamp(norm, min=float(node.attrs["epsilon"]))]

    def onnx_nodes(self, node):
        from onnx import helper, numpy_helper

        out = node.outputs[0]
        axes, eps, norm, clipped = (f"{out}::{k}" for k in ("axes", "eps", "norm", "clipped"))
        axes_value = numpy_helper.from_array(np.array(node.attrs["axes"], np.int64), axes)
        eps_value = numpy_helper.from_array(np.array(node.attrs["epsilon"], np.float32), eps)
        return [helper.make_node("Constant", [], [axes], name=f"{node.name}::axes", value=axes_value),
                helper.make_node("Constant", [], [eps], name=f"{node.name}::eps", value=eps_value),
                helper.make_node("ReduceL2", [node.inputs[0], axes], [norm], name=f"{node.name}::norm", keepdims=1),
                helper.make_node("Clip", [norm, eps], [clipped], name=f"{node.name}::clip"),
                helper.make_node("Div", [node.inputs[0], clipped], [out], name=node.name)]
