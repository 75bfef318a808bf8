"""Pooling: MaxPool, AveragePool (ceil_mode, count_include_pad, asymmetric pads,
dilations), GlobalAveragePool and GlobalMaxPool.

Both windowed pools pad explicitly to exactly the extent the output needs, then
pool without implicit padding; that gives ONNX's rules (ceil-mode windows may
run past the end but never start in the right padding) on every axis at once.
"""

import torch
import torch.nn.functional as F

from .conv import pop_auto_pad, same_pads, torch_pad_arg
from .dtype_rules import FLOAT, require_dtype
from .registry import WINDOW_RANGES, Op, TensorInfo, fail, register, static_dims, unsupported

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

_POOL_ATTRS = {"ceil_mode": 0, "dilations": [], "kernel_shape": [], "pads": [], "strides": []}


def pool_output_size(size, k, s, d, pb, pe, ceil_mode) -> int:
    span = d * (k - 1) + 1
    num = size + pb + pe - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + pb:
        out -= 1  # the last window would start in the right padding
    return out


class _WindowPool(Op):
    onnx_only_attrs = ("auto_pad",)
    attr_ranges = WINDOW_RANGES

    def from_onnx(self, ctx, node):
        a = node.attrs
        x = ctx.info(node.inputs[0])
        nsp = len(x.shape) - 2
        if nsp not in (1, 2, 3):
            unsupported(node, f"input rank {len(x.shape)}: only 1-3 spatial dims are supported")
        if not a["kernel_shape"]:
            fail(node, "kernel_shape is required")
        auto_pad = pop_auto_pad(node)
        a["kernel_shape"] = list(a["kernel_shape"])
        a["strides"] = list(a["strides"] or [1] * nsp)
        a["dilations"] = list(a["dilations"] or [1] * nsp)
        a["pads"] = list(a["pads"] or [0] * (2 * nsp))
        if auto_pad == "VALID":
            a["pads"] = [0] * (2 * nsp)
        elif auto_pad != "NOTSET":
            total = []
            for size, k, s, d in zip(static_dims(node, x.shape[2:]), a["kernel_shape"], a["strides"], a["dilations"]):
                out = -(-size // s)
                total.append(max(0, (out - 1) * s + (k - 1) * d + 1 - size))
            a["pads"] = same_pads(auto_pad, total)

    def out_spatial(self, node, shape) -> list:
        a = node.attrs
        nsp = len(shape) - 2
        spatial = static_dims(node, shape[2:])
        for key, n in (("kernel_shape", nsp), ("strides", nsp), ("dilations", nsp), ("pads", 2 * nsp)):
            if len(a[key]) != n:
                fail(node, f"{key} has {len(a[key])} entries, expected {n}")
        out = []
        for i in range(nsp):
            o = pool_output_size(spatial[i], a["kernel_shape"][i], a["strides"][i], a["dilations"][i],
                                 a["pads"][i], a["pads"][i + nsp], a["ceil_mode"])
            if o <= 0:
                fail(node, f"the window does not fit spatial axis {i} of size {spatial[i]}")
            out.append(o)
        return out

    def infer(self, node, ins):
        x = ins[0]
        return [TensorInfo(x.dtype, (x.shape[0], x.shape[1], *self.out_spatial(node, x.shape)))]

    def exact_pads(self, node, shape) -> list:
        """Pads that make the padded input exactly as long as the output's windows need."""
        a = node.attrs
        nsp = len(shape) - 2
        out = self.out_spatial(node, shape)
        ends = []
        for i in range(nsp):
            need = (out[i] - 1) * a["strides"][i] + a["dilations"][i] * (a["kernel_shape"][i] - 1) + 1
            ends.append(need - shape[2 + i] - a["pads"][i])  # may be negative: unused tail
        return a["pads"][:nsp] + ends


@register
class MaxPool(_WindowPool):
    name = "MaxPool"
    outputs = (1, 2)
    attrs = dict(_POOL_ATTRS, storage_order=0)
    summary = "max over windows; ceil_mode, dilations, asymmetric pads (no Indices output)"
    quant = "passthrough"

    def from_onnx(self, ctx, node):
        if len(node.outputs) > 1 and node.outputs[1]:
            unsupported(node, "the Indices output is not supported")
        node.outputs = node.outputs[:1]
        super().from_onnx(ctx, node)

    def forward(self, node, xs):
        x = xs[0]
        a = node.attrs
        nsp = x.dim() - 2
        pads = self.exact_pads(node, tuple(x.shape))
        fill = float("-inf") if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
        x = F.pad(x, torch_pad_arg(pads), value=fill)
        return [_MAX_POOL[nsp](x, a["kernel_shape"], a["strides"], 0, a["dilations"])]


@register
class AveragePool(_WindowPool):
    name = "AveragePool"
    attrs = dict(_POOL_ATTRS, count_include_pad=0)
    summary = "mean over windows; ceil_mode, count_include_pad, dilations, asymmetric pads"
    quant = "pool"

    def forward(self, node, xs):
        total, count = self.window_sums(node, xs[0])
        return [total / count]

    def onnx_nodes(self, node):
        # ONNX Runtime fuses DQ -> AveragePool -> Q into QLinearAveragePool, which
        # rejects a `dilations` attribute even when every entry is 1 (the default).
        from onnx import helper

        attrs = {k: v for k, v in node.attrs.items() if v is not None and v != []}
        if all(d == 1 for d in attrs.get("dilations", [])):
            attrs.pop("dilations", None)
        return [helper.make_node(node.op, node.inputs, node.outputs, name=node.name, **attrs)]

    def window_sums(self, node, x):
        """Every window's sum and its ONNX divisor, in x's dtype (float64 sums of
        integer codes are exact, which the integer simulator relies on)."""
        a = node.attrs
        nsp = x.dim() - 2
        pads = self.exact_pads(node, tuple(x.shape))
        # The divisor counts input cells, plus the explicit pads under
        # count_include_pad, but never the ceil-mode overhang past the pads.
        mask = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
        if a["count_include_pad"]:
            mask = F.pad(mask, torch_pad_arg(a["pads"]), value=1.0)
            extra = [0] * nsp + [pads[nsp + i] - a["pads"][nsp + i] for i in range(nsp)]
            mask = F.pad(mask, torch_pad_arg(extra))
        else:
            mask = F.pad(mask, torch_pad_arg(pads))
        x = F.pad(x, torch_pad_arg(pads))
        c = x.shape[1]
        ones = torch.ones((c, 1, *a["kernel_shape"]), dtype=x.dtype)
        total = _CONV[nsp](x, ones, None, a["strides"], 0, a["dilations"], c)
        count = _CONV[nsp](mask, ones[:1], None, a["strides"], 0, a["dilations"], 1)
        return total, count


class _GlobalPool(Op):
    def infer(self, node, ins):
        x = ins[0]
        if len(x.shape) < 3:
            fail(node, f"input rank {len(x.shape)} has no spatial axes")
        return [TensorInfo(x.dtype, (*x.shape[:2], *([1] * (len(x.shape) - 2))))]


@register
class GlobalAveragePool(_GlobalPool):
    name = "GlobalAveragePool"
    summary = "mean over all spatial axes, kept as size-1 dims"
    quant = "pool"

    def forward(self, node, xs):
        x = xs[0]
        return [x.mean(dim=tuple(range(2, x.dim())), keepdim=True)]


@register
class GlobalMaxPool(_GlobalPool):
    name = "GlobalMaxPool"
    summary = "max over all spatial axes, kept as size-1 dims"
    quant = "passthrough"  # selects a value: the output shares the input's parameters

    def infer(self, node, ins):
        require_dtype(node, ins[0], FLOAT)
        return super().infer(node, ins)

    def forward(self, node, xs):
        x = xs[0]
        return [x.amax(dim=tuple(range(2, x.dim())), keepdim=True)]
