"""Max pooling that records where each maximum was, and the unpooling that puts values back
there: MediaPipe's custom ops MaxPoolingWithArgmax2D and MaxUnpooling2D (its segmentation
models' encoder-decoder; ``mediapipe/util/tflite/operations``), NCHW.

The positions are *window-local*, as MediaPipe's: ``fy * kw + fx`` within the pooling window
(int64 here; the .tflite file holds them as floats ``+ 0.1``). The unpooling derives each
value's place from its own window geometry, ``(y * sh - pad_top + i // kw, x * sw - pad_left +
i % kw)``, which is why these are not ONNX's MaxPool Indices / MaxUnpool (global indices).

int8: both only move codes ("passthrough"): the pooled codes are the input's, the unpooled
output shares its input's grid with the zero point where no value lands (the integer simulator
passes it as the optional ``fill`` input).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import UnsupportedError
from .registry import INTS, Op, TensorInfo, fail, register


def _window(node) -> tuple:
    a = node.attrs
    return tuple(a["kernel_shape"]), tuple(a["strides"]), tuple(a["pads"])


class _LocalIndexPool(Op):
    quant = "passthrough"
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0], "output_size": [1, 1]}
    attr_kinds = {"kernel_shape": INTS, "strides": INTS, "pads": INTS, "output_size": INTS}
    attr_ranges = {"kernel_shape": (1, 1 << 16), "strides": (1, 1 << 16), "pads": (0, 1 << 16),
                   "output_size": (1, 1 << 30)}

    def check(self, node, x) -> None:
        k, s, p = _window(node)
        size = node.attrs["output_size"]
        if len(x.shape) != 4 or len(k) != 2 or len(s) != 2 or len(p) != 2 or len(size) != 2:
            fail(node, f"needs a 4-D input and 2-D kernel_shape, strides, (top, left) pads and output_size, got "
                       f"{list(x.shape)}, {list(k)}, {list(s)}, {list(p)}, {list(size)}")

    def onnx_nodes(self, node):
        raise UnsupportedError(f"node '{node.name}' ({node.op}): window-local indices have no ONNX form (ONNX's "
                               f"MaxUnpool places values by global indices); run it with npuforge")


@register
class MaxPoolWindowArgmax(_LocalIndexPool):
    name = "MaxPoolWindowArgmax"
    outputs = (2, 2)
    summary = ("max over kh x kw windows (pads (top, left): the window starts there; cells outside the input "
               "are skipped) of an output_size (h, w) map, and the window-local int64 index fy * kw + fx of each "
               "first maximum (MediaPipe's MaxPoolingWithArgmax2D)")

    def infer(self, node, ins):
        x = ins[0]
        self.check(node, x)
        size = tuple(node.attrs["output_size"])
        return [TensorInfo(x.dtype, (*x.shape[:2], *size)), TensorInfo("int64", (*x.shape[:2], *size))]

    def forward(self, node, xs):
        (kh, kw), (sh, sw), (pt, pl) = _window(node)
        oh, ow = node.attrs["output_size"]
        x = xs[0]
        n, c, h, w = x.shape
        # top / left padded by the pads, bottom / right padded (or cropped) to exactly the windows' extent;
        # -inf is never a first maximum, as the kernel never reads outside the input
        bottom, right = (oh - 1) * sh + kh - pt - h, (ow - 1) * sw + kw - pl - w
        xp = F.pad(x.double(), (pl, right, pt, bottom), value=float("-inf"))
        cols = F.unfold(xp.reshape(n * c, 1, *xp.shape[2:]), (kh, kw), stride=(sh, sw))  # [n c, kh kw, oh ow]
        index = torch.argmax(cols, dim=1)  # the first of equal maxima, as the kernel's strict >
        values = torch.gather(cols, 1, index[:, None]).reshape(n, c, oh, ow).to(x.dtype)
        return [values, index.reshape(n, c, oh, ow)]


@register
class MaxUnpoolWindow(_LocalIndexPool):
    name = "MaxUnpoolWindow"
    inputs = (2, 3)
    summary = ("x placed into an output_size (h, w) map of fill (default 0) at (y * sh - top + i // kw, x * sw - "
               "left + i % kw) for its window-local int64 index i; the later of two values for one place wins, "
               "places outside are dropped (MediaPipe's MaxUnpooling2D)")
    zero_fill_input = 2  # the integer simulator passes the output's zero point here

    def infer(self, node, ins):
        x, i = ins[:2]
        self.check(node, x)
        if list(i.shape) != list(x.shape) or i.dtype not in ("int64", "int32"):
            fail(node, f"indices must be int64 of the input's shape {list(x.shape)}, got {i.dtype} {list(i.shape)}")
        return [TensorInfo(x.dtype, (*x.shape[:2], *node.attrs["output_size"]))]

    def forward(self, node, xs):
        (kh, kw), (sh, sw), (pt, pl) = _window(node)
        oh, ow = node.attrs["output_size"]
        x, idx = xs[0], xs[1].long()
        fill = 0.0 if len(xs) < 3 or xs[2] is None else float(xs[2].reshape(-1)[0])
        n, c, h, w = x.shape
        ys = torch.arange(h).reshape(1, 1, h, 1) * sh - pt + idx // kw
        xs_ = torch.arange(w).reshape(1, 1, 1, w) * sw - pl + idx % kw
        inside = (ys >= 0) & (ys < oh) & (xs_ >= 0) & (xs_ < ow)
        target = torch.where(inside, ys * ow + xs_, torch.full_like(ys, oh * ow)).reshape(n * c, -1)
        source = torch.arange(h * w).expand(n * c, -1)
        # the last source (in row-major order) that lands on each place, deterministically
        winner = torch.full((n * c, oh * ow + 1), -1, dtype=torch.long).scatter_reduce(
            1, target, source, "amax", include_self=True)[:, :oh * ow]
        flat = x.reshape(n * c, h * w)
        y = torch.gather(flat, 1, winner.clamp(min=0))
        y = torch.where(winner >= 0, y, torch.full_like(y, fill))
        return [y.reshape(n, c, oh, ow)]
