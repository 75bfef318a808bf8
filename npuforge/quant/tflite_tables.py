"""TFLite's int8 activation kernels as 256-entry tables, and the output parameters TFLite fixes.

A unary int8 op is a function of its input code, so a table over every code computes
it exactly. With ``tflite_multipliers=True`` the quantizer fills a table by running
TFLite's own integer arithmetic (as LiteRT's reference kernels do, checked in
tests/test_tflite_vs_litert.py) where that is not the float op rounded once:

* RELU / RELU6 / RELU_N1_TO_1 standalone: ``zp_y + MultiplyByQuantizedMultiplier(x - zp_x,
  s_x / s_y)`` clamped to the activation's range (bounds ``zp_y + round(bound / s_y)``).
* LEAKY_RELU: two requantizations of ``x - zp_x``, by ``s_x / s_y`` and ``s_x * alpha / s_y``.
* HARD_SWISH: the 16-bit fixed-point kernel (input shifted left by 7 bits, a "relu-ish"
  factor in [0, 1] on a 3/32768 scale, a truncating doubling high multiply).

LOGISTIC and TANH are LiteRT's float function rounded to the output grid, which is the
quantizer's own table (measured equal over every code), on the output grids TFLite
requires (:data:`FIXED_OUTPUTS`, SOFTMAX's too: its kernel is quant/tflite_softmax.py).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import UnsupportedError
from ..sim.int_ops import requantize_fixedpoint
from .fixedpoint import doubling_high_mul, rdbp, round_half_away
from .params import QParams
from .requant import quantize_multiplier

# op -> (scale, zero point) of its int8 output, as TFLite requires them (uint8: zero point + 128)
FIXED_OUTPUTS = {"Sigmoid": (1.0 / 256, -128), "Softmax": (1.0 / 256, -128), "Tanh": (1.0 / 128, 0)}


def fixed_output(op: str, dtype: str) -> QParams | None:
    if op not in FIXED_OUTPUTS or dtype not in ("int8", "uint8"):
        return None
    scale, zp = FIXED_OUTPUTS[op]
    return QParams(dtype, np.float32(scale), np.int32(zp + (128 if dtype == "uint8" else 0)))


def activation_range(kind: str, p: QParams) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized: the output codes a fused (or standalone)
    activation ("", "Relu", "Relu6", "ReluN1To1") keeps, bounds ``zp + round(bound / s)``."""
    def q(f):
        return int(p.zero_point) + int(round_half_away(np.float32(f) / np.float32(p.scale)))
    lo, hi = p.qmin, p.qmax
    if kind in ("Relu", "Relu6"):
        lo = max(lo, q(0.0))
    if kind == "Relu6":
        hi = min(hi, q(6.0))
    if kind == "ReluN1To1":
        lo, hi = max(lo, q(-1.0)), min(hi, q(1.0))
    return lo, hi


def _codes(p: QParams) -> np.ndarray:
    return np.arange(p.qmin, p.qmax + 1, dtype=np.int64)


def relu_table(xq: QParams, yq: QParams, kind: str) -> np.ndarray:
    """TFLite's quantized RELU, RELU6 or RELU_N1_TO_1 (``kind`` as :func:`activation_range`)
    over every input code."""
    m, s = quantize_multiplier(np.float64(np.float32(xq.scale) / np.float32(yq.scale)))  # float32, as LiteRT
    y = requantize_fixedpoint(torch.from_numpy(_codes(xq) - int(xq.zero_point)), int(m), int(s)).numpy()
    return np.clip(int(yq.zero_point) + y, *activation_range(kind, yq))


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
    pre_out = doubling_high_mul(x, out_m, bits=16)
    r = x
    if relu_e > 0:
        r = _sat_shift16(r, relu_e - 1)
    r = doubling_high_mul(r, relu_m, bits=16)
    if relu_e > 0:
        r = _sat_shift16(r, 1)
    if relu_e < 0:
        r = rdbp(r, -relu_e)
    r = (r + (1 << 15)) >> 1
    y = rdbp(doubling_high_mul(r, pre_out, bits=16, rounding=False), -out_e) + int(yq.zero_point)
    return np.clip(y, yq.qmin, yq.qmax)


def leaky_relu_table(xq: QParams, yq: QParams, alpha: float) -> np.ndarray:
    """TFLite's quantized LEAKY_RELU over every input code: ``x - zp_x`` requantized by
    ``s_x / s_y`` where it is >= 0, by ``s_x * alpha / s_y`` below (the ratios in float32,
    as LiteRT's Prepare computes them)."""
    f32 = np.float32
    x = torch.from_numpy(_codes(xq) - int(xq.zero_point))
    out = []
    for real in (f32(xq.scale) / f32(yq.scale), f32(f32(xq.scale) * f32(alpha)) / f32(yq.scale)):
        m, s = quantize_multiplier(np.float64(real))
        out.append(requantize_fixedpoint(x, int(m), int(s)).numpy())
    y = np.where(x.numpy() >= 0, out[0], out[1]) + int(yq.zero_point)
    return np.clip(y, yq.qmin, yq.qmax)


RELU_KINDS = {(0.0, None): "Relu", (0.0, 6.0): "Relu6", (-1.0, 1.0): "ReluN1To1"}  # (lo, hi) -> TFLite op


def clip_bounds(graph, node) -> tuple:
    """(lo, hi) of a Relu or Clip node, None for an open side; a bound computed from the data
    (no number) is an UnsupportedError naming the node."""
    if node.op == "Relu":
        return 0.0, None
    bounds = []
    for k in (1, 2):
        name = node.inputs[k] if len(node.inputs) > k else ""
        if name and not graph.values[name].is_const:
            raise UnsupportedError(f"node '{node.name}' (Clip): its {('min', 'max')[k - 1]} bound '{name}' is "
                                   f"computed from the data, not a number; TFLite's RELU kernels take constant bounds "
                                   f"(the integer rule is MAXIMUM / MINIMUM of the codes)")
        bounds.append(float(np.asarray(graph.values[name].data).reshape(-1)[0]) if name else None)
    return tuple(bounds)


def tflite_table(graph, node, xq: QParams, yq: QParams) -> np.ndarray | None:
    """The table of TFLite's kernel for a lut node, or None where the float table is TFLite's."""
    if node.op in ("Relu", "Clip") and clip_bounds(graph, node) in RELU_KINDS:
        return relu_table(xq, yq, RELU_KINDS[clip_bounds(graph, node)])
    if node.op == "HardSwish":
        return hard_swish_table(xq, yq)
    if node.op == "LeakyRelu":
        return leaky_relu_table(xq, yq, node.attrs["alpha"])
    return None
