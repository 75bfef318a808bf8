"""Convolutions: Conv and ConvTranspose (1-3 spatial dims, groups, dilations).

auto_pad is resolved into explicit ``pads`` at import, so the IR always states
its padding; asymmetric pads are applied with an explicit zero pad.
"""

import torch.nn.functional as F

from .activation import FUSED_ATTRS, FUSED_KINDS, apply_fused, check_fused, onnx_with_fused
from .registry import INT32_MAX, WINDOW_RANGES, Op, TensorInfo, fail, register, static_dims, unsupported

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def same_pads(auto_pad: str, total: list) -> list:
    """Split total padding per axis into [begins..., ends...] as ONNX's SAME_* says."""
    small = [t // 2 for t in total]
    big = [t - t // 2 for t in total]
    return small + big if auto_pad == "SAME_UPPER" else big + small


def torch_pad_arg(pads: list) -> list:
    """ONNX [b1, b2, .., e1, e2, ..] -> F.pad's (b_last, e_last, b_prev, e_prev, ...)."""
    n = len(pads) // 2
    out = []
    for k in reversed(range(n)):
        out += [pads[k], pads[k + n]]
    return out


def pop_auto_pad(node) -> str:
    auto_pad = node.attrs.pop("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PADS:
        unsupported(node, f"auto_pad '{auto_pad}' is not one of {', '.join(_AUTO_PADS)}")
    return auto_pad


def _spatial_defaults(node, nsp: int, kernel) -> None:
    a = node.attrs
    a["kernel_shape"] = list(a["kernel_shape"] or kernel)
    a["strides"] = list(a["strides"] or [1] * nsp)
    a["dilations"] = list(a["dilations"] or [1] * nsp)
    a["pads"] = list(a["pads"] or [0] * (2 * nsp))
    for key, n in (("kernel_shape", nsp), ("strides", nsp), ("dilations", nsp), ("pads", 2 * nsp)):
        if len(a[key]) != n:
            unsupported(node, f"{key} has {len(a[key])} entries, expected {n}")
    if list(a["kernel_shape"]) != list(kernel):
        fail(node, f"kernel_shape {a['kernel_shape']} disagrees with the weight's {list(kernel)}")


def _import_spatial(ctx, node):
    """Shared start of Conv / ConvTranspose import: -> (input info, weight info, spatial dims, auto_pad)."""
    x, w = ctx.info(node.inputs[0]), ctx.info(node.inputs[1])
    _check_rank(node, x, w)
    nsp = len(w.shape) - 2
    auto_pad = pop_auto_pad(node)
    _spatial_defaults(node, nsp, static_dims(node, w.shape[2:], "weight"))
    return x, w, nsp, auto_pad


def _check_rank(node, x, w):
    if len(x.shape) not in (3, 4, 5):
        unsupported(node, f"input rank {len(x.shape)}: only 1-3 spatial dims are supported")
    if len(w.shape) != len(x.shape):
        fail(node, f"weight rank {len(w.shape)} differs from input rank {len(x.shape)}")


@register
class Conv(Op):
    name = "Conv"
    inputs = (2, 3)
    attrs = {"dilations": [], "group": 1, "kernel_shape": [], "pads": [], "strides": [], **FUSED_ATTRS}
    attr_kinds = FUSED_KINDS
    attr_ranges = {**WINDOW_RANGES, "group": (1, INT32_MAX)}
    onnx_only_attrs = ("auto_pad",)
    quant = "compute"
    summary = ("N-d convolution, groups, dilations, explicit asymmetric pads (auto_pad resolved at import); "
               "optional fused activation")

    def from_onnx(self, ctx, node):
        x, w, nsp, auto_pad = _import_spatial(ctx, node)
        a = node.attrs
        if auto_pad == "VALID":
            a["pads"] = [0] * (2 * nsp)
        elif auto_pad != "NOTSET":
            spatial = static_dims(node, x.shape[2:])
            total = []
            for size, k, s, d in zip(spatial, a["kernel_shape"], a["strides"], a["dilations"]):
                out = -(-size // s)
                total.append(max(0, (out - 1) * s + (k - 1) * d + 1 - size))
            a["pads"] = same_pads(auto_pad, total)

    def infer(self, node, ins):
        x, w = ins[0], ins[1]
        _check_rank(node, x, w)
        check_fused(node, w.shape[0])
        a = node.attrs
        g = a["group"]
        cin = x.shape[1]
        if isinstance(cin, int) and cin != w.shape[1] * g:
            fail(node, f"input has {cin} channels but weight {list(w.shape)} with group {g} expects {w.shape[1] * g}")
        if w.shape[0] % g:
            fail(node, f"{w.shape[0]} output channels are not divisible by group {g}")
        if len(ins) > 2 and ins[2] is not None and tuple(ins[2].shape) != (w.shape[0],):
            fail(node, f"bias shape {list(ins[2].shape)} should be [{w.shape[0]}]")
        nsp = len(x.shape) - 2
        spatial = static_dims(node, x.shape[2:])
        out = []
        for i in range(nsp):
            span = a["dilations"][i] * (a["kernel_shape"][i] - 1) + 1
            size = spatial[i] + a["pads"][i] + a["pads"][i + nsp] - span
            if size < 0:
                fail(node, f"kernel span {span} exceeds padded input size {size + span} on spatial axis {i}")
            out.append(size // a["strides"][i] + 1)
        return [TensorInfo(x.dtype, (x.shape[0], w.shape[0], *out))]

    def forward(self, node, xs):
        x, w = xs[0], xs[1]
        b = xs[2] if len(xs) > 2 else None
        a = node.attrs
        nsp = x.dim() - 2
        pads = a["pads"]
        if pads[:nsp] == pads[nsp:]:
            padding = pads[:nsp]
        else:
            x = F.pad(x, torch_pad_arg(pads))
            padding = [0] * nsp
        return [apply_fused(node, _CONV[nsp](x, w, b, a["strides"], padding, a["dilations"], a["group"]))]

    def macs(self, node, ins, outs):
        w = ins[1].shape
        return _numel(outs[0].shape) * _numel(w[1:])

    def weight_axis(self, node, graph):
        return 0

    def onnx_nodes(self, node):
        return onnx_with_fused(node)


@register
class ConvTranspose(Op):
    name = "ConvTranspose"
    inputs = (2, 3)
    attrs = {"dilations": [], "group": 1, "kernel_shape": [], "output_padding": [], "pads": [], "strides": []}
    attr_ranges = {**WINDOW_RANGES, "group": (1, INT32_MAX), "output_padding": (0, INT32_MAX)}
    onnx_only_attrs = ("auto_pad", "output_shape")
    quant = "compute"
    summary = "N-d transposed convolution; output_shape and auto_pad resolved to explicit pads at import"

    def from_onnx(self, ctx, node):
        x, w, nsp, auto_pad = _import_spatial(ctx, node)
        a = node.attrs
        a["output_padding"] = list(a["output_padding"] or [0] * nsp)
        if len(a["output_padding"]) != nsp:
            unsupported(node, f"output_padding has {len(a['output_padding'])} entries, expected {nsp}")
        target = list(a.pop("output_shape", []))
        if len(target) == nsp + 2:
            target = target[2:]
        if auto_pad == "VALID":
            a["pads"] = [0] * (2 * nsp)
        elif target or auto_pad != "NOTSET":
            # ONNX Runtime's rule (the oracle; the spec text is ambiguous here),
            # measured: pad the full output down to the target with the larger
            # half at the end under SAME_UPPER, at the start otherwise (SAME_LOWER,
            # or NOTSET with output_shape); an output_shape past the full size
            # grows the tail, while auto_pad alone never grows the output.
            spatial = static_dims(node, x.shape[2:])
            explicit = bool(target)
            if not explicit:
                target = [size * s for size, s in zip(spatial, a["strides"])]
            if len(target) != nsp:
                unsupported(node, f"output_shape {target} does not have {nsp} spatial entries")
            heads, tails = [], []
            for i in range(nsp):
                full = a["strides"][i] * (spatial[i] - 1) + a["output_padding"][i]
                full += (a["kernel_shape"][i] - 1) * a["dilations"][i] + 1
                total = full - target[i]
                if total < 0 and explicit:
                    a["output_padding"][i] -= total
                total = max(total, 0)
                small, big = total // 2, total - total // 2
                heads.append(small if auto_pad == "SAME_UPPER" else big)
                tails.append(big if auto_pad == "SAME_UPPER" else small)
            a["pads"] = heads + tails

    def infer(self, node, ins):
        x, w = ins[0], ins[1]
        _check_rank(node, x, w)
        a = node.attrs
        g = a["group"]
        if isinstance(x.shape[1], int) and x.shape[1] != w.shape[0]:
            fail(node, f"input has {x.shape[1]} channels but weight {list(w.shape)} expects {w.shape[0]}")
        if w.shape[0] % g:
            fail(node, f"{w.shape[0]} input channels are not divisible by group {g}")
        cout = w.shape[1] * g
        if len(ins) > 2 and ins[2] is not None and tuple(ins[2].shape) != (cout,):
            fail(node, f"bias shape {list(ins[2].shape)} should be [{cout}]")
        nsp = len(x.shape) - 2
        spatial = static_dims(node, x.shape[2:])
        out = []
        for i in range(nsp):
            size = a["strides"][i] * (spatial[i] - 1) + a["output_padding"][i]
            size += (a["kernel_shape"][i] - 1) * a["dilations"][i] + 1 - a["pads"][i] - a["pads"][i + nsp]
            if size <= 0:
                fail(node, f"pads leave no output on spatial axis {i}")
            out.append(size)
        return [TensorInfo(x.dtype, (x.shape[0], cout, *out))]

    def forward(self, node, xs):
        x, w = xs[0], xs[1]
        b = xs[2] if len(xs) > 2 else None
        a = node.attrs
        nsp = x.dim() - 2
        # Full transposed conv, then the output_padding tail, then crop the pads:
        # this covers asymmetric pads and output_padding >= stride alike.
        y = _CONV_T[nsp](x, w, None, a["strides"], 0, 0, a["group"], a["dilations"])
        y = F.pad(y, torch_pad_arg([0] * nsp + a["output_padding"]))
        pads = a["pads"]
        index = [slice(None), slice(None)]
        for i in range(nsp):
            index.append(slice(pads[i], y.shape[2 + i] - pads[i + nsp]))
        y = y[tuple(index)]
        if b is not None:
            y = y + b.reshape(1, -1, *([1] * nsp))
        return [y]

    def macs(self, node, ins, outs):
        w = ins[1].shape
        return _numel(ins[0].shape) * _numel(w[1:])

    def weight_axis(self, node, graph):
        # weight [Cin, Cout/group, ...]: per output channel only without groups
        return 1 if node.attrs["group"] == 1 else None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) else 1
    return n
