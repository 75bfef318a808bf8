"""The NPU's integer kernels, as the program simulator runs them: NumPy on int64 arrays of
codes, one stripe of output rows at a time, with every constant taken from a command's
parameter block. Nothing here reads a graph; the graph-level integer simulator
(npuforge/sim) is the oracle these kernels are tested against, bit for bit.

Arithmetic (``R`` is the requantization by a stored multiplier M and shift s):

* ``R`` double rounding (gemmlowp's MultiplyByQuantizedMultiplier): saturate to int32,
  shift left by max(s, 0) and saturate, ``floor((x * M + 2^30) / 2^31)``, then divide by
  2^max(-s, 0) rounding half away from zero; single rounding (``single_rounding`` set,
  TFLite's FULLY_CONNECTED): ``floor((x * M + 2^(30 - s)) / 2^(31 - s))``.
* conv / depthwise / fully connected: ``acc = bias + sum w * (x - zp_in)``, exact (float64
  products and sums of int8 x int16 codes stay far below 2^53), ``y = clamp(zp_out + R(acc),
  act_min, act_max)``; a second multiplier for negative accumulators (LeakyRelu).
* add / sub: each operand ``R((x - zp) * 2^L)``, their sum divided by 2^L (mode 0) or
  requantized by the output multiplier (mode 1, TFLite's ADD); mul: ``R(a' * b')``.
* pools: window sums of ``x - zp`` and a rounded division by the stored divisor after
  ``R(sum * 2^L)``; max pool: the largest code of each window, padding never chosen.
* lut: ``table[x - qmin]``; concat: channels side by side; resize_bilinear: TFLite's
  10-bit interpolation weights, the weighted sum rounded half away from zero by 2^20.
"""

from __future__ import annotations

import numpy as np

from ..quant.fixedpoint import rdbp

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
FLOAT64_EXACT = 2**53
PAD_MAX = -(2**40)  # a max pool's padding: below every code


def requantize(acc: np.ndarray, mult, shift, single: bool = False) -> np.ndarray:
    mult = np.asarray(mult, np.int64)
    shift = np.asarray(shift, np.int64)
    x = np.clip(acc, I32_MIN, I32_MAX)
    if single:
        total = 31 - shift
        return (x * mult + np.left_shift(np.int64(1), total - 1)) >> total
    x = np.clip(x << np.maximum(shift, 0), I32_MIN, I32_MAX)
    y = (x * mult + (1 << 30)) >> 31
    return rdbp(y, np.maximum(-shift, 0))


def rounded_divide(num: np.ndarray, den) -> np.ndarray:
    """num / den rounded half away from zero (den > 0)."""
    den = np.asarray(den, np.int64)
    q = (2 * np.abs(num) + den) // (2 * den)
    return np.where(num < 0, -q, q)


def needed_rows(kind: str, p: dict, a: int, b: int, in_h: int, k: int = 0) -> tuple[int, int]:
    """Rows [lo, hi) of input k that output rows [a, b) read; lo < 0 or hi > in_h are padding."""
    if kind in ("conv", "depthwise", "avgpool", "maxpool"):
        kh, sh, dh, top = p["kernel_h"], p["stride_h"], p["dilation_h"], p["pad_top"]
        return a * sh - top, (b - 1) * sh - top + (kh - 1) * dh + 1
    if kind in ("add", "sub", "mul", "lut", "concat"):
        return (0, 1) if in_h == 1 else (a, b)
    if kind == "resize_bilinear":
        return int(p["row_lo"][a:b].min()), int(p["row_hi"][a:b].max()) + 1
    return 0, in_h  # fully connected, global pooling: the whole input


def _taps(x: np.ndarray, p: dict, rows: int, out_w: int, fill) -> list:
    """Every kernel tap's [rows, out_w, C] view of the stripe x ([R, W, C], rows already padded)."""
    kh, kw = p["kernel_h"], p["kernel_w"]
    sh, sw, dh, dw, left = p["stride_h"], p["stride_w"], p["dilation_h"], p["dilation_w"], p["pad_left"]
    need = (out_w - 1) * sw + (kw - 1) * dw + 1
    right = need - x.shape[1] - left
    x = np.pad(x, ((0, 0), (left, max(right, 0)), (0, 0)), constant_values=fill)[:, :need]
    return [x[i * dh: i * dh + (rows - 1) * sh + 1: sh, j * dw: j * dw + (out_w - 1) * sw + 1: sw]
            for i in range(kh) for j in range(kw)]


def _finish_compute(acc: np.ndarray, p: dict) -> np.ndarray:
    single = bool(p.get("single_rounding", 0))
    y = requantize(acc, p["multiplier"], p["shift"], single)
    if "multiplier_neg" in p:
        y = np.where(acc < 0, requantize(acc, p["multiplier_neg"], p["shift_neg"], single), y)
    return np.clip(y + p["zp_out"], p["act_min"], p["act_max"])


def conv(x, p, w, rows: int, out_w: int) -> np.ndarray:
    """conv: x [R, W, Cin] codes, w [Cout, KH, KW, Cin/group] -> [rows, out_w, Cout]."""
    taps = _taps(x - p["zp_in"], p, rows, out_w, 0)
    group = p["group"]
    cout, cg = w.shape[0], w.shape[3]
    og = cout // group
    acc = np.empty((rows * out_w, cout), np.float64)
    for g in range(group):
        cols = np.concatenate([t[..., g * cg:(g + 1) * cg].reshape(rows * out_w, cg) for t in taps], axis=1)
        wg = w[g * og:(g + 1) * og].reshape(og, -1).astype(np.float64)
        acc[:, g * og:(g + 1) * og] = cols.astype(np.float64) @ wg.T
    acc = acc.astype(np.int64).reshape(rows, out_w, cout) + p["bias"]
    return _finish_compute(acc, p)


def depthwise(x, p, w, rows: int, out_w: int) -> np.ndarray:
    """depthwise: w [KH, KW, C]."""
    taps = _taps(x - p["zp_in"], p, rows, out_w, 0)
    kw = p["kernel_w"]
    acc = np.zeros(taps[0].shape, np.int64)
    for t, tap in enumerate(taps):
        acc += tap * w[t // kw, t % kw].astype(np.int64)
    return _finish_compute(acc + p["bias"], p)


def fully_connected(x, p, w) -> np.ndarray:
    """x [1, 1, K], w [N, K] -> [1, 1, N]."""
    xs = (x.reshape(-1) - p["zp_in"]).astype(np.float64)
    acc = (w.astype(np.float64) @ xs).astype(np.int64) + p["bias"]
    return _finish_compute(acc, p).reshape(1, 1, -1)


def _pool_output(total: np.ndarray, count: np.ndarray, divisor, p: dict) -> np.ndarray:
    if p.get("code_average", 0):
        return rounded_divide(total + count * p["zp_in"], count)
    bits = p["extra_bits"]
    t = requantize(total << bits, p["multiplier"], p["shift"])
    return rounded_divide(t, divisor << bits) + p["zp_out"]


def avgpool(x, p, rows: int, out_w: int, row0: int) -> np.ndarray:
    total = sum(_taps(x - p["zp_in"], p, rows, out_w, 0))
    shape = (-1, out_w, 1)
    count = p["count"].reshape(shape)[row0:row0 + rows]
    divisor = p["divisor"].reshape(shape)[row0:row0 + rows] if "divisor" in p else None
    return _pool_output(total, count, divisor, p)


def global_avgpool(x, p) -> np.ndarray:
    total = (x - p["zp_in"]).sum(axis=(0, 1), keepdims=True)
    count = p["count"].reshape(1, 1, 1)
    divisor = p["divisor"].reshape(1, 1, 1) if "divisor" in p else None
    return _pool_output(total, count, divisor, p)


def maxpool(x, p, rows: int, out_w: int) -> np.ndarray:
    return np.maximum.reduce(_taps(x, p, rows, out_w, PAD_MAX))


def elementwise(kind: str, a, b, p) -> np.ndarray:
    a, b = a - p["zp_in0"], b - p["zp_in1"]
    if kind == "mul":
        return requantize(a * b, p["multiplier"], p["shift"]) + p["zp_out"]
    bits = p["left_shift"]
    ta = requantize(a << bits, p["multiplier0"], p["shift0"])
    tb = requantize(b << bits, p["multiplier1"], p["shift1"])
    total = ta + tb if kind == "add" else ta - tb
    if p["mode"] == 1:  # TFLite's ADD: the sum requantized by the output multiplier
        return requantize(total, p["multiplier_out"], p["shift_out"]) + p["zp_out"]
    return rdbp(total, bits) + p["zp_out"]


def lut(x, p) -> np.ndarray:
    return p["table"][x - p["qmin"]]


def resize_bilinear(x, p, row0_in: int, a: int, b: int) -> np.ndarray:
    q = x - p["code_shift"]
    rlo, rhi = p["row_lo"][a:b] - row0_in, p["row_hi"][a:b] - row0_in
    wy0, wy1 = p["row_w0"][a:b, None, None], p["row_w1"][a:b, None, None]
    clo, chi = p["col_lo"], p["col_hi"]
    wx0, wx1 = p["col_w0"][None, :, None], p["col_w1"][None, :, None]
    total = 0
    for r, wy in ((rlo, wy0), (rhi, wy1)):
        row = q[r] * wy
        total = total + row[:, clo] * wx0 + row[:, chi] * wx1
    y = total + np.where(total > 0, 1 << 19, -(1 << 19))
    y = np.where(y < 0, -((-y) >> 20), y >> 20)  # C division by 2^20: toward zero
    return y + p["code_shift"]
