"""Resize: nearest, (multi)linear and cubic, every coordinate transformation mode but
tf_crop_and_resize, applied one axis at a time.

Coordinates are computed with ONNX Runtime's float arithmetic, so that
nearest-neighbour ties resolve the same way.
"""

import math

import numpy as np
import torch

from .registry import Op, TensorInfo, const_ints, fail, norm_axis, register, static_dims, unsupported

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


@register
class Resize(Op):
    name = "Resize"
    inputs = (1, 4)
    attrs = {
        "antialias": 0, "axes": [], "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75,
        "exclude_outside": 0, "extrapolation_value": 0.0, "keep_aspect_ratio_policy": "stretch",
        "mode": "nearest", "nearest_mode": "round_prefer_floor",
    }
    summary = "nearest / linear / cubic resize by scales or sizes; all coordinate modes but tf_crop_and_resize"

    def quant_kind(self, node, graph):
        """nearest: moves codes; linear: the integer bilinear rule (quant/resize_rule.py) where
        TFLite's integer RESIZE_BILINEAR applies, else float."""
        if node.attrs["mode"] == "nearest":
            return "passthrough"
        from ..quant.resize_rule import eligible

        scales = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
        scales = np.asarray(graph.values[scales].data).reshape(-1) if scales and graph.values[scales].is_const \
            else None
        if scales is not None and scales.size == 0:
            scales = None
        x, y = (graph.values[n].shape for n in (node.inputs[0], node.outputs[0]))
        return "interpolate" if eligible(node, x, y, scales) else None

    def quantize_integers(self, graph, node, add):
        if node.attrs["mode"] != "nearest":
            from ..quant.resize_rule import quantize_integers

            quantize_integers(graph, node, add)

    def integer_forward(self, sim, node, env):
        from ..quant.resize_rule import integer_forward

        return integer_forward(sim, node, env)

    def from_onnx(self, ctx, node):
        a = node.attrs
        if a["mode"] not in ("nearest", "linear", "cubic"):
            unsupported(node, f"mode '{a['mode']}' is not supported; use nearest, linear or cubic")
        if a["coordinate_transformation_mode"] not in _COORD_MODES:
            unsupported(node, f"coordinate_transformation_mode '{a['coordinate_transformation_mode']}' "
                              f"is not supported; supported: {', '.join(_COORD_MODES)}")
        if a["nearest_mode"] not in _NEAREST_MODES:
            unsupported(node, f"nearest_mode '{a['nearest_mode']}' is not one of {', '.join(_NEAREST_MODES)}")
        if a["keep_aspect_ratio_policy"] not in _POLICIES:
            unsupported(node, f"keep_aspect_ratio_policy '{a['keep_aspect_ratio_policy']}' is not one of "
                              f"{', '.join(_POLICIES)}")
        if a["antialias"]:
            unsupported(node, "antialias=1 is not supported")

    def plan(self, node, shape, scales, sizes):
        """Per axis: (output size, float32 scale) for every axis of the input."""
        rank = len(shape)
        axes = [norm_axis(node, x, rank) for x in node.attrs["axes"]] or list(range(rank))
        out = list(shape)
        scale = [np.float32(1.0)] * rank
        if scales is not None and len(scales):
            if sizes is not None and len(sizes):
                fail(node, "only one of scales and sizes may be given")
            if len(scales) != len(axes):
                fail(node, f"scales has {len(scales)} entries for {len(axes)} axes")
            for ax, s in zip(axes, scales):
                if not 0 < s < math.inf:  # (NaN fails both)
                    fail(node, f"scale {s} must be a positive finite number")
                if s != 1.0:
                    dim = static_dims(node, (shape[ax],))[0]
                    size = np.float64(dim) * np.float64(np.float32(s))  # float64: 1e38 x dim stays finite
                    if size > 1 << 62:
                        fail(node, f"scale {s} makes axis {ax} {size:.3g} long; use a smaller scale")
                    out[ax] = int(math.floor(dim * np.float32(s)))
                    scale[ax] = np.float32(s)
        elif sizes is not None and len(sizes):
            if len(sizes) != len(axes):
                fail(node, f"sizes has {len(sizes)} entries for {len(axes)} axes")
            dims = [static_dims(node, (shape[ax],))[0] for ax in axes]
            policy = node.attrs["keep_aspect_ratio_policy"]
            if policy != "stretch":
                ratios = [np.float32(s) / np.float32(d) for s, d in zip(sizes, dims)]
                r = min(ratios) if policy == "not_larger" else max(ratios)
                sizes = [int(np.round(np.float32(r) * np.float32(d))) for d in dims]
                scale_list = [np.float32(r)] * len(axes)
            else:
                scale_list = [np.float32(s) / np.float32(d) for s, d in zip(sizes, dims)]
            for ax, s, sc in zip(axes, sizes, scale_list):
                out[ax] = int(s)
                scale[ax] = np.float32(sc)
        else:
            fail(node, "needs scales or sizes")
        return out, scale

    def infer(self, node, ins):
        x = ins[0]
        scales = ins[2].value if len(ins) > 2 and ins[2] is not None else None
        sizes = const_ints(node, ins[3], "sizes") if len(ins) > 3 and ins[3] is not None else None
        if scales is None and len(ins) > 2 and ins[2] is not None:
            unsupported(node, "scales must be known when the graph is imported")
        out, _ = self.plan(node, x.shape, None if scales is None else scales.tolist(), sizes)
        return [TensorInfo(x.dtype, tuple(out))]

    def source_coords(self, node, n_in: int, n_out: int, scale) -> torch.Tensor:
        """Source coordinate of every output index, with ONNX Runtime's float
        arithmetic (float32, but float64 inside half_pixel_symmetric)."""
        mode = node.attrs["coordinate_transformation_mode"]
        f32 = np.float32
        x = np.arange(n_out, dtype=f32)
        s = f32(scale)
        if mode == "half_pixel" or (mode == "pytorch_half_pixel" and n_out > 1):
            c = (x + f32(0.5)) / s - f32(0.5)
        elif mode == "asymmetric":
            c = x / s
        elif mode == "align_corners" and n_out > 1:
            c = x * f32(n_in - 1) / f32(n_out - 1)
        elif mode == "half_pixel_symmetric":
            adjustment = f32(n_out) / (s * f32(n_in))
            offset = f32(n_in) / f32(2) * (f32(1) - adjustment)
            c = (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(f32)
        else:  # a single output position
            c = np.zeros(n_out, f32)
        return torch.from_numpy(c)

    def nearest(self, node, coords: torch.Tensor, n_in: int) -> torch.Tensor:
        mode = node.attrs["nearest_mode"]
        if mode == "floor":
            idx = torch.floor(coords)
        elif mode == "ceil":
            idx = torch.ceil(coords)
        else:
            fl = torch.floor(coords)
            tie = coords == fl + 0.5
            rounded = torch.floor(coords + 0.5)
            idx = torch.where(tie, fl if mode == "round_prefer_floor" else fl + 1, rounded)
        return idx.to(torch.int64).clamp(0, n_in - 1)

    def cubic(self, node, x: torch.Tensor, axis: int, coords: torch.Tensor, n_in: int) -> torch.Tensor:
        """ONNX's cubic convolution along ``axis``: four taps around each source coordinate with
        Keys' weights for ``cubic_coeff_a``; taps beyond the edge read the edge value, or, with
        ``exclude_outside``, weigh 0 and the others are renormalized."""
        a = float(node.attrs["cubic_coeff_a"])
        c = coords.to(torch.float64)
        base = torch.floor(c)
        t = c - base
        taps = base.to(torch.int64)[:, None] + torch.arange(-1, 3)[None, :]  # [n_out, 4]
        d = (t[:, None] - torch.arange(-1, 3, dtype=torch.float64)[None, :]).abs()  # distance to each tap
        near = ((a + 2) * d - (a + 3)) * d * d + 1  # |d| <= 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # 1 < |d| < 2
        w = torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))
        if node.attrs["exclude_outside"]:
            w = torch.where((taps < 0) | (taps >= n_in), torch.zeros_like(w), w)
            w = w / w.sum(dim=1, keepdim=True)
        idx = taps.clamp(0, n_in - 1)
        view = [1] * x.dim()
        view[axis] = coords.numel()
        out = 0
        for k in range(4):
            out = out + x.index_select(axis, idx[:, k]) * w[:, k].to(x.dtype).reshape(view)
        return out

    def forward(self, node, xs):
        x = xs[0]
        scales = xs[2].tolist() if len(xs) > 2 and xs[2] is not None and xs[2].numel() else None
        sizes = [int(s) for s in xs[3].tolist()] if len(xs) > 3 and xs[3] is not None else None
        out, scale = self.plan(node, tuple(x.shape), scales, sizes)
        for axis in range(x.dim()):
            n_in, n_out = x.shape[axis], out[axis]
            if n_in == n_out and scale[axis] == 1.0:
                continue
            coords = self.source_coords(node, n_in, n_out, scale[axis])
            if node.attrs["mode"] == "nearest":
                x = x.index_select(axis, self.nearest(node, coords, n_in))
                continue
            if node.attrs["mode"] == "cubic":
                x = self.cubic(node, x, axis, coords, n_in)
                continue
            coords = coords.clamp(0, n_in - 1)
            lo = torch.floor(coords).to(torch.int64)
            hi = (lo + 1).clamp(max=n_in - 1)
            view = [1] * x.dim()
            view[axis] = n_out
            w = (coords - lo.to(torch.float32)).to(x.dtype).reshape(view)
            x = x.index_select(axis, lo) * (1 - w) + x.index_select(axis, hi) * w
        return [x]
