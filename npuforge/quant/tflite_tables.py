"""TFLite's int8 activation kernels as 256-entry tables, and the output parameters TFLite fixes.

A unary int8 op is a function of its input code, so a table over every code computes
it exactly. With ``tflite_multipliers=True`` the quantizer fills a table by running
TFLite's own integer arithmetic (as LiteRT's reference kernels do, checked in
tests/test_tflite_vs_litert.py) where that is not the float op rounded once:

* RELU / RELU6 / RELU_N1_TO_1 standalone: ``zp_y + MultiplyByQuantizedMultiplier(x - zp_x,
  s_x / s_y)`` clamped to the activation's range (bounds ``zp_y + round(bound / s_y)``).
* HARD_SWISH: the 16-bit fixed-point kernel (input shifted left by 7 bits, a "relu-ish"
  factor in [0, 1] on a 3/32768 scale, a truncating doubling high multiply).

LOGISTIC and TANH are LiteRT's float function rounded to the output grid, which is the
quantizer's own table (measured equal over every code), on the output grids TFLite
requires (:data:`FIXED_OUTPUTS`, SOFTMAX's too: its kernel is quant/tflite_softmax.py).
"""

from __future__ import annotations

import numpy as np

from .params import QParams
from .requant import quantize_multiplier

# op -> (scale, zero point) of its int8 output, as TFLite requires them (uint8: zero point + 128)
FIXED_OUTPUTS = {"Sigmoid": (1.0 / 256, -128), "Softmax": (1.0 / 256, -128), "Tanh": (1.0 / 128, 0)}


def fixed_output(op: str, dtype: str) -> QParams | None:
    if op not in FIXED_OUTPUTS or dtype not in ("int8", "uint8"):
        return None
    scale, zp = FIXED_OUTPUTS[op]
    return QParams(dtype, np.float32(scale), np.int32(zp + (128 if dtype == "uint8" else 0)))


def _round_away(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _mbqm(x: np.ndarray, m: int, shift: int) -> np.ndarray:
    """MultiplyByQuantizedMultiplier on int64 arrays holding int32 values."""
    x = x * (1 << max(shift, 0))
    y = (x * m + (1 << 30)) >> 31  # SaturatingRoundingDoublingHighMul (m >= 0)
    return _rdbp(y, max(-shift, 0))


def _rdbp(x: np.ndarray, e: int) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: x / 2^e rounded half away from zero."""
    if e == 0:
        return x
    mask = (1 << e) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + ((x & mask) > threshold)


def _codes(p: QParams) -> np.ndarray:
    return np.arange(p.qmin, p.qmax + 1, dtype=np.int64)


def relu_table(xq: QParams, yq: QParams, lo: float | None, hi: float | None) -> np.ndarray:
    """TFLite's quantized RELU (lo 0), RELU6 (0, 6) or RELU_N1_TO_1 (-1, 1) over every input code."""
    m, s = quantize_multiplier(np.float64(np.float32(xq.scale) / np.float32(yq.scale)))  # float32, as LiteRT
    zy = int(yq.zero_point)
    y = zy + _mbqm(_codes(xq) - int(xq.zero_point), int(m), int(s))

    def bound(f):
        return zy + int(_round_away(np.float32(f) / np.float32(yq.scale)))

    amin = yq.qmin if lo is None else max(yq.qmin, bound(lo))
    amax = yq.qmax if hi is None else min(yq.qmax, bound(hi))
    return np.clip(y, amin, amax)


def _srdhm16(a: np.ndarray, b: int) -> np.ndarray:
    """gemmlowp's int16 SaturatingRoundingDoublingHighMul (division truncating toward zero)."""
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    out = np.trunc((ab + nudge) / (1 << 15)).astype(np.int64)
    return np.where((a == -32768) & (b == -32768), 32767, out)


def _sdhm16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SaturatingDoublingHighMul (int16, truncating: no rounding nudge)."""
    out = np.trunc((a * b) / (1 << 15)).astype(np.int64)
    return np.where((a == -32768) & (b == -32768), 32767, out)


def _sat_shift16(x: np.ndarray, amount: int) -> np.ndarray:
    return np.clip(x * (1 << amount), -32768, 32767)


def _int16_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier, then the int32 multiplier rounded to its high 16 bits."""
    m, s = quantize_multiplier(np.float64(real))
    m = int(m)
    m16 = 32767 if m >= 2**31 - 1 - (1 << 15) else (m + (1 << 15)) >> 16
    return m16, int(s)


def hard_swish_table(xq: QParams, yq: QParams) -> np.ndarray:
    """TFLite's quantized HARD_SWISH over every input code."""
    hires = np.float32(np.float32(1.0 / 128.0) * np.float32(xq.scale))
    out_m, out_e = _int16_multiplier(float(np.float32(hires / np.float32(yq.scale))))
    relu_m, relu_e = _int16_multiplier(float(np.float32(hires / np.float32(3.0 / 32768.0))))
    x = (_codes(xq) - int(xq.zero_point)) * (1 << 7)
    pre_out = _srdhm16(x, out_m)
    r = x
    if relu_e > 0:
        r = _sat_shift16(r, relu_e - 1)
    r = _srdhm16(r, relu_m)
    if relu_e > 0:
        r = _sat_shift16(r, 1)
    if relu_e < 0:
        r = _rdbp(r, -relu_e)
    r = (r + (1 << 15)) >> 1
    y = _rdbp(_sdhm16(r, pre_out), -out_e) + int(yq.zero_point)
    return np.clip(y, yq.qmin, yq.qmax)


RELU_KINDS = {(0.0, None): "Relu", (0.0, 6.0): "Relu6", (-1.0, 1.0): "ReluN1To1"}  # (lo, hi) -> TFLite op


def clip_bounds(graph, node) -> tuple:
    """(lo, hi) of a Relu or Clip node, None for an open side."""
    if node.op == "Relu":
        return 0.0, None
    bounds = []
    for k in (1, 2):
        name = node.inputs[k] if len(node.inputs) > k else ""
        bounds.append(float(np.asarray(graph.values[name].data).reshape(-1)[0]) if name else None)
    return tuple(bounds)


def tflite_table(graph, node, xq: QParams, yq: QParams) -> np.ndarray | None:
    """The table of TFLite's kernel for a lut node, or None where the float table is TFLite's."""
    if node.op in ("Relu", "Clip") and clip_bounds(graph, node) in RELU_KINDS:
        return relu_table(xq, yq, *clip_bounds(graph, node))
    if node.op == "HardSwish":
        return hard_swish_table(xq, yq)
    return None
