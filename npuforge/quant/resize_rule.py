"""The integer bilinear Resize (quantization kind "interpolate"), as TFLite's int8 / int16
RESIZE_BILINEAR computes it (its reference ``ResizeBilinearInteger``).

The output shares the input's grid, so interpolating the codes interpolates the reals.
Per output row (and likewise per column), in units of 2^-10 of an input pixel:

* ``s = round(2^10 * n_in / n_out)`` (align_corners: ``(n_in - 1) / (n_out - 1)``);
* position ``p = i * s``, or ``i * s + s / 2 - 2^9`` for half-pixel centres;
* ``lo = max(p / 2^10, 0)``, ``hi = min(ceil(p / 2^10), n_in - 1)`` (C division), weights
  ``2^10 - (p - 2^10 lo)`` on ``lo`` and ``p - 2^10 lo`` on ``hi``;

then ``y = (sum of the four weighted codes + 2^19 sign) / 2^20`` truncated: the product of
two 10-bit weights rounded half away from zero. Codes are taken as int8 (a uint8 value's
codes less 128), as TFLite sees them, so an int8 export computes the same.

The coordinates are TFLite's 10-bit approximations of ONNX's; the rule is only chosen
where the ONNX coordinate mode is one TFLite has (asymmetric, align_corners, half_pixel,
pytorch_half_pixel) and the scale is the size ratio, and the fake-quant executor's exact
float interpolation can differ from it by a code.
"""

from __future__ import annotations

import numpy as np
import torch

from .fixedpoint import c_div

# ONNX coordinate mode -> (align_corners, half_pixel_centers) of TFLite
TFLITE_MODES = {"asymmetric": (False, False), "align_corners": (True, False), "half_pixel": (False, True),
                "pytorch_half_pixel": (False, True)}


def axis_weights(n_in: int, n_out: int, align: bool, half: bool):
    """(lo, hi, weight of lo, weight of hi) per output index, weights in 2^-10 units."""
    if align and n_out > 1:
        s = ((1 << 10) * (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)
    else:
        s = ((1 << 10) * n_in + n_out // 2) // n_out
    i = np.arange(n_out, dtype=np.int64)
    p = i * s + s // 2 - (1 << 9) if half else i * s
    lo = np.maximum(c_div(p, 1 << 10), 0)
    hi = np.minimum(c_div(p + (1 << 10) - 1, 1 << 10), n_in - 1)
    frac = p - (1 << 10) * lo
    return lo, hi, (1 << 10) - frac, frac


def eligible(node, in_shape, out_shape, scales) -> bool:
    """A 4-D linear Resize of H and W only, in a TFLite coordinate mode, at the size ratio."""
    a = node.attrs
    if a["mode"] != "linear" or a["coordinate_transformation_mode"] not in TFLITE_MODES or a["antialias"]:
        return False
    if len(in_shape) != 4 or not all(isinstance(d, int) for d in (*in_shape, *out_shape)):
        return False
    if tuple(in_shape[:2]) != tuple(out_shape[:2]):
        return False
    if a["coordinate_transformation_mode"] == "pytorch_half_pixel" and min(out_shape[2:]) == 1:
        return False
    if scales is not None:  # ONNX's coordinates divide by the given scale, TFLite's by the size ratio
        ratio = [np.float32(o) / np.float32(i) for i, o in zip(in_shape[2:], out_shape[2:])]
        if any(abs(float(s) - float(r)) > 1e-6 * float(r) for s, r in zip(scales[2:], ratio)):
            return False
    return True


def quantize_integers(graph, node, add) -> None:
    align, half = TFLITE_MODES[node.attrs["coordinate_transformation_mode"]]
    add("align_corners", np.asarray(int(align), np.int32))
    add("half_pixel_centers", np.asarray(int(half), np.int32))


def integer_forward(sim, node, env) -> list:
    p = sim._q(node.outputs[0])
    shift = 128 if p.dtype == "uint8" else 0
    q = sim._as_codes(node.inputs[0], env).to(torch.int64) - shift
    out = sim.graph.values[node.outputs[0]].shape
    align, half = bool(sim._int(node, "align_corners")), bool(sim._int(node, "half_pixel_centers"))
    ylo, yhi, wy0, wy1 = (torch.from_numpy(v) for v in axis_weights(q.shape[2], out[2], align, half))
    xlo, xhi, wx0, wx1 = (torch.from_numpy(v) for v in axis_weights(q.shape[3], out[3], align, half))
    total = torch.zeros((q.shape[0], q.shape[1], out[2], out[3]), dtype=torch.int64)
    for rows, wy in ((ylo, wy0), (yhi, wy1)):
        r = q.index_select(2, rows) * wy.reshape(1, 1, -1, 1)
        for cols, wx in ((xlo, wx0), (xhi, wx1)):
            total += r.index_select(3, cols) * wx.reshape(1, 1, 1, -1)
    half_unit = torch.where(total > 0, 1 << 19, -(1 << 19))
    y = total + half_unit
    y = torch.where(y < 0, -((-y) >> 20), y >> 20)  # C division by 2^20: toward zero
    return [sim._store(y + shift, p)]
