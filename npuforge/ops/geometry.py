"""MediaPipe's attention-mesh geometry ops (the face landmark model with attention, from its
TFLite custom ops of version 2; ``mediapipe/util/tflite/operations``): a crop matrix from
landmarks, a bilinear crop of a feature map by that matrix, and landmarks mapped back by one.

Each computes in float32 in the order MediaPipe's CPU kernel does (its double-precision steps
in float64), so that an imported model gives MediaPipe's numbers to float32 rounding. They have
no int8 rule: their results are coordinates and sampling positions computed from the
landmarks, data-dependent geometry that an integer program would run on its host CPU, and the
quantizer keeps them in float with that reason. Their ONNX forms (``onnx_nodes``: the float
export, the QDQ export, calibration in ONNX Runtime and the fast engine's nodes in float) are
standard ops: GridSample for the crop, the rotation's cosine and sine without atan2.

Matrices are [N, 4, 4]; only their first two rows are read, as 2-D affine maps
``(x, y) -> (m00 x + m01 y + m03, m10 x + m11 y + m13)``.
"""

from __future__ import annotations

import numpy as np
import torch

from .registry import FLOAT, INT, INTS, Op, TensorInfo, fail, register

FLOAT_REASON = "data-dependent geometry (coordinates computed from landmarks): no integer rule, run on the host"


class _Nodes:
    """Standard ONNX nodes for one geometry node: ``op`` appends one and names its output."""

    def __init__(self, node):
        self.node, self.nodes = node, []

    def op(self, op_type: str, inputs: list, out: str | None = None, **attrs) -> str:
        from onnx import helper

        name = out or f"{self.node.outputs[0]}::{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def const(self, value) -> str:
        from onnx import numpy_helper

        arr = np.asarray(value)
        arr = arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)
        return self.op("Constant", [], value=numpy_helper.from_array(arr))

    def take(self, x: str, axis: int, start: int, end: int) -> str:
        return self.op("Slice", [x, self.const([start]), self.const([end]), self.const([axis])])


class _Geometry(Op):
    float_reason = FLOAT_REASON


def _affine(m: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple:
    """MediaPipe's DotProduct of the matrix rows with (x, y, 0, 1), summed left to right in float32;
    m [N, 4, 4], x and y [N, ...]."""
    shape = (-1,) + (1,) * (x.dim() - 1)
    row = lambda r, c: m[:, r, c].reshape(shape)  # noqa: E731
    return tuple(row(r, 0) * x + row(r, 1) * y + row(r, 2) * 0.0 + row(r, 3) for r in (0, 1))


@register
class LandmarksToTransformMatrix(_Geometry):
    name = "LandmarksToTransformMatrix"
    attrs = {"subset": [], "left": 0, "right": 0, "target_rotation": 0.0, "output_size": [1, 1],
             "scale": [1.0, 1.0]}
    attr_kinds = {"subset": INTS, "left": INT, "right": INT, "target_rotation": FLOAT, "output_size": INTS}
    attr_ranges = {"subset": (0, 1 << 30), "left": (0, 1 << 30), "right": (0, 1 << 30), "output_size": (1, 1 << 16)}
    summary = ("MediaPipe's Landmarks2TransformMatrix (v2): landmarks [N, L, 3] -> the [N, 4, 4] map from an "
               "output_size (h, w) crop, rotated so landmarks left -> right lie at target_rotation and sized by "
               "scale (x, y) times the subset's rotated bounding box, to landmark coordinates")

    def infer(self, node, ins):
        (p,) = ins
        if len(p.shape) != 3 or p.shape[2] != 3:
            fail(node, f"landmarks must be [N, L, 3], got {list(p.shape)}")
        a = node.attrs
        if not a["subset"] or len(a["output_size"]) != 2 or len(a["scale"]) != 2:
            fail(node, "needs a subset of landmarks, an output_size (h, w) and a scale (x, y)")
        if isinstance(p.shape[1], int) and max(a["subset"] + [a["left"], a["right"]]) >= p.shape[1]:
            fail(node, f"a landmark index beyond the input's {p.shape[1]} landmarks")
        if min(a["scale"]) <= 0:
            fail(node, f"scale {a['scale']} must be positive")
        return [TensorInfo(p.dtype, (p.shape[0], 4, 4))]

    def forward(self, node, xs):
        a = node.attrs
        p = xs[0].float()
        oh, ow = (float(v) for v in a["output_size"])
        d = p[:, a["right"], :2] - p[:, a["left"], :2]
        r = torch.tensor(a["target_rotation"], dtype=torch.float32) - torch.atan2(d[:, 1], d[:, 0])
        c, s = torch.cos(r)[:, None], torch.sin(r)[:, None]
        pts = p[:, a["subset"], :2]
        xr, yr = c * pts[..., 0] - s * pts[..., 1], s * pts[..., 0] + c * pts[..., 1]  # (+ 0 * 1)
        lo_x, hi_x = xr.amin(1, keepdim=True), xr.amax(1, keepdim=True)
        lo_y, hi_y = yr.amin(1, keepdim=True), yr.amax(1, keepdim=True)
        mid_x, mid_y = (lo_x + hi_x) / 2, (lo_y + hi_y) / 2
        cx, cy = c * mid_x + s * mid_y, -s * mid_x + c * mid_y  # the centre rotated back
        sx = torch.tensor(a["scale"][0], dtype=torch.float32) * (hi_x - lo_x) / ow
        sy = torch.tensor(a["scale"][1], dtype=torch.float32) * (hi_y - lo_y) / oh
        # shift(centre) . rotation . scale . shift(-output / 2), as MediaPipe's 4x4 products give it
        m00, m01, m10, m11 = c * sx, s * sy, -s * sx, c * sy
        t0 = m00 * torch.tensor(-ow / 2) + m01 * torch.tensor(-oh / 2) + 0.0 + cx
        t1 = m10 * torch.tensor(-ow / 2) + m11 * torch.tensor(-oh / 2) + 0.0 + cy
        zero, one = torch.zeros_like(c), torch.ones_like(c)
        rows = [m00, m01, zero, t0, m10, m11, zero, t1, zero, zero, one, zero, zero, zero, zero, one]
        return [torch.cat(rows, 1).reshape(-1, 4, 4)]

    def onnx_nodes(self, node):
        """The same map in standard ops. ONNX has no atan2: the rotation's cosine and sine come from the
        unit vector left -> right, ``cos(t - a) = cos t cos a + sin t sin a`` (float32 rounding apart,
        the same numbers)."""
        a, b = node.attrs, _Nodes(node)
        oh, ow = (float(v) for v in a["output_size"])
        p = node.inputs[0]
        xy = lambda t, k: b.take(t, 2, k, k + 1)  # noqa: E731  ([N, L, 1] column k)
        ends = b.op("Gather", [p, b.const([a["left"], a["right"]])], axis=1)  # [N, 2, 3]
        d = b.op("Sub", [b.take(ends, 1, 1, 2), b.take(ends, 1, 0, 1)])  # [N, 1, 3]
        dx, dy = xy(d, 0), xy(d, 1)
        norm = b.op("Sqrt", [b.op("Add", [b.op("Mul", [dx, dx]), b.op("Mul", [dy, dy])])])
        same = b.op("Equal", [norm, b.const(0.0)])  # both landmarks at one place: atan2(0, 0) = 0
        ca = b.op("Where", [same, b.const(1.0), b.op("Div", [dx, norm])])
        sa = b.op("Where", [same, b.const(0.0), b.op("Div", [dy, norm])])
        ct, st = b.const(np.cos(np.float32(a["target_rotation"]))), b.const(np.sin(np.float32(a["target_rotation"])))
        c = b.op("Add", [b.op("Mul", [ct, ca]), b.op("Mul", [st, sa])])
        s = b.op("Sub", [b.op("Mul", [st, ca]), b.op("Mul", [ct, sa])])
        pts = b.op("Gather", [p, b.const(a["subset"])], axis=1)  # [N, K, 3]
        x, y = xy(pts, 0), xy(pts, 1)
        xr = b.op("Sub", [b.op("Mul", [c, x]), b.op("Mul", [s, y])])
        yr = b.op("Add", [b.op("Mul", [s, x]), b.op("Mul", [c, y])])
        ext = {(v, f): b.op(f, [v, b.const([1])], keepdims=1) for v in (xr, yr) for f in ("ReduceMin", "ReduceMax")}
        half = b.const(0.5)
        mx = b.op("Mul", [b.op("Add", [ext[xr, "ReduceMin"], ext[xr, "ReduceMax"]]), half])
        my = b.op("Mul", [b.op("Add", [ext[yr, "ReduceMin"], ext[yr, "ReduceMax"]]), half])
        cx = b.op("Add", [b.op("Mul", [c, mx]), b.op("Mul", [s, my])])
        cy = b.op("Sub", [b.op("Mul", [c, my]), b.op("Mul", [s, mx])])
        sx = b.op("Div", [b.op("Mul", [b.const(a["scale"][0]), b.op("Sub", [ext[xr, "ReduceMax"],
                                                                              ext[xr, "ReduceMin"]])]), b.const(ow)])
        sy = b.op("Div", [b.op("Mul", [b.const(a["scale"][1]), b.op("Sub", [ext[yr, "ReduceMax"],
                                                                              ext[yr, "ReduceMin"]])]), b.const(oh)])
        m00, m01 = b.op("Mul", [c, sx]), b.op("Mul", [s, sy])
        m10, m11 = b.op("Neg", [b.op("Mul", [s, sx])]), b.op("Mul", [c, sy])
        shx, shy = b.const(-ow / 2), b.const(-oh / 2)
        t0 = b.op("Add", [b.op("Add", [b.op("Mul", [m00, shx]), b.op("Mul", [m01, shy])]), cx])
        t1 = b.op("Add", [b.op("Add", [b.op("Mul", [m10, shx]), b.op("Mul", [m11, shy])]), cy])
        zero = b.op("Mul", [c, b.const(0.0)])
        one = b.op("Add", [zero, b.const(1.0)])
        rows = b.op("Concat", [m00, m01, zero, t0, m10, m11, zero, t1, zero, zero, one, zero, zero, zero, zero, one],
                    axis=2)
        b.op("Reshape", [rows, b.const([-1, 4, 4])], out=node.outputs[0])
        return b.nodes


@register
class TransformTensorBilinear(_Geometry):
    name = "TransformTensorBilinear"
    inputs = (2, 2)
    attrs = {"output_size": [1, 1]}
    attr_kinds = {"output_size": INTS}
    attr_ranges = {"output_size": (1, 1 << 16)}
    summary = ("MediaPipe's TransformTensorBilinear (v2): an output_size (h, w) crop of x [N, C, H, W] sampled "
               "bilinearly where the [N, 4, 4] map sends each output pixel's centre; 0 where that falls outside")

    def infer(self, node, ins):
        x, m = ins
        if len(x.shape) != 4 or list(m.shape[1:]) != [4, 4] or len(m.shape) != 3:
            fail(node, f"needs x [N, C, H, W] and a matrix [N, 4, 4], got {list(x.shape)} and {list(m.shape)}")
        if len(node.attrs["output_size"]) != 2:
            fail(node, "output_size must be (h, w)")
        return [TensorInfo(x.dtype, (x.shape[0], x.shape[1], *node.attrs["output_size"]))]

    def forward(self, node, xs):
        x, m = xs[0].float(), xs[1].float()
        n, ch, h, w = x.shape
        oh, ow = node.attrs["output_size"]
        # pixel centres: the translation gains 0.5 (m0 + m1) - 0.5, in double as the kernel adds it
        m = m.clone()
        m64 = m.double()
        for r in (0, 1):
            m[:, r, 3] = (m64[:, r, 3] + (m64[:, r, 0] * 0.5 + m64[:, r, 1] * 0.5 - 0.5)).float()
        oy, ox = torch.meshgrid(torch.arange(oh, dtype=torch.float32), torch.arange(ow, dtype=torch.float32),
                                indexing="ij")
        tx, ty = _affine(m, ox.expand(n, oh, ow), oy.expand(n, oh, ow))
        inside = (tx >= 0) & (tx <= w - 1) & (ty >= 0) & (ty <= h - 1)
        fx, fy = torch.floor(tx), torch.floor(ty)
        right, lower = (tx - fx).double()[:, None], (ty - fy).double()[:, None]
        flat = torch.cat([x.reshape(n, ch, h * w), torch.zeros(n, ch, 1)], 2)  # index h * w reads 0

        def read(yy, xx):
            ok = (yy >= 0) & (xx >= 0) & (yy < h) & (xx < w)
            idx = torch.where(ok, yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1), torch.full_like(yy, h * w))
            return torch.gather(flat, 2, idx.long().reshape(n, 1, -1).expand(n, ch, -1)).reshape(n, ch, oh, ow)

        q11, q21, q12, q22 = (read(fy + dy, fx + dx).double() for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)))
        # each row's blend in double, kept as a float (the kernel's float variables), then the column's
        upper = ((1.0 - right) * q11 + right * q21).float().double()
        below = ((1.0 - right) * q12 + right * q22).float().double()
        out = (lower * below + (1.0 - lower) * upper).float()
        return [torch.where(inside[:, None], out, torch.zeros((), dtype=torch.float32))]

    def onnx_nodes(self, node):
        """ONNX's GridSample (bilinear, zeros beyond the edge, corners aligned: pixel ``i`` at
        ``2 i / (W - 1) - 1``) at the mapped pixel centres, times the inside-the-image mask."""
        b = _Nodes(node)
        x, m = node.inputs
        oh, ow = node.attrs["output_size"]
        # (only the shape of x matters below: read through Shape, so the sizes are the graph's)
        hw = b.op("Cast", [b.take(b.op("Shape", [x]), 0, 2, 4)], to=1)  # [H, W] as float
        rows = b.take(m, 1, 0, 2)  # [N, 2, 4]
        shift = b.op("Sub", [b.op("Mul", [b.op("Add", [b.take(rows, 2, 0, 1), b.take(rows, 2, 1, 2)]),
                                          b.const(0.5)]), b.const(0.5)])  # [N, 2, 1]
        rows = b.op("Add", [rows, b.op("Mul", [shift, b.const([0.0, 0.0, 0.0, 1.0])])])
        oy, ox = np.meshgrid(np.arange(oh, dtype=np.float32), np.arange(ow, dtype=np.float32), indexing="ij")
        grid = np.stack([ox.ravel(), oy.ravel(), np.zeros(oh * ow), np.ones(oh * ow)]).astype(np.float32)  # [4, P]
        tc = b.op("Transpose", [b.op("MatMul", [rows, b.const(grid)])], perm=[0, 2, 1])  # [N, P, 2]: x, y
        last = b.op("Sub", [b.op("Concat", [b.take(hw, 0, 1, 2), b.take(hw, 0, 0, 1)], axis=0), b.const(1.0)])
        inside = b.op("And", [b.op("GreaterOrEqual", [tc, b.const(0.0)]), b.op("LessOrEqual", [tc, last])])
        inside = b.op("ReduceMin", [b.op("Cast", [inside], to=1), b.const([2])], keepdims=0)  # [N, P]
        norm = b.op("Sub", [b.op("Div", [b.op("Mul", [tc, b.const(2.0)]), last]), b.const(1.0)])
        grid4 = b.op("Reshape", [norm, b.const([0, oh, ow, 2])])
        sampled = b.op("GridSample", [x, grid4], mode="linear", padding_mode="zeros", align_corners=1)
        mask = b.op("Reshape", [inside, b.const([0, 1, oh, ow])])
        b.op("Mul", [sampled, mask], out=node.outputs[0])
        return b.nodes


@register
class TransformLandmarks(_Geometry):
    name = "TransformLandmarks"
    inputs = (2, 2)
    summary = ("MediaPipe's TransformLandmarks (v2): landmarks [N, L, 2 or 3] with (x, y) mapped by the first two "
               "rows of a [N, 4, 4] matrix; z kept")

    def infer(self, node, ins):
        p, m = ins
        if len(p.shape) != 3 or p.shape[2] not in (2, 3) or len(m.shape) != 3 or list(m.shape[1:]) != [4, 4]:
            fail(node, f"needs landmarks [N, L, 2 or 3] and a matrix [N, 4, 4], got {list(p.shape)} and "
                       f"{list(m.shape)}")
        return [TensorInfo(p.dtype, p.shape)]

    def forward(self, node, xs):
        p, m = xs[0].float(), xs[1].float()
        x, y = _affine(m, p[..., 0], p[..., 1])
        return [torch.stack([x, y, *([p[..., 2]] if p.shape[2] == 3 else [])], -1)]

    def onnx_nodes(self, node):
        """(x, y) times the matrix's 2x2 block, plus its translation; z (if any) kept."""
        b = _Nodes(node)
        p, m = node.inputs
        block = b.op("Transpose", [b.take(b.take(m, 1, 0, 2), 2, 0, 2)], perm=[0, 2, 1])  # [N, 2, 2]
        shift = b.op("Transpose", [b.take(b.take(m, 1, 0, 2), 2, 3, 4)], perm=[0, 2, 1])  # [N, 1, 2]
        xy = b.op("Add", [b.op("MatMul", [b.take(p, 2, 0, 2), block]), shift])
        b.op("Concat", [xy, b.take(p, 2, 2, 3)], out=node.outputs[0], axis=2)  # z, or nothing: [N, L, 0]
        return b.nodes
