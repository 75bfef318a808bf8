"""LiteRT int8 kernels that TensorFlow's converter writes (a Keras layer normalization is ``mean``,
``SQUARED_DIFFERENCE``, ``mean``, ``+ eps``, ``RSQRT``, ...; ConvNeXt's activation is GELU), as the
integer program an int8 ``.tflite`` import gives them: bit for bit with LiteRT
(tests/test_tflite_import.py, benchmarks/tflite_int8_import.py).

* GELU (``activations.cc``): LUTPopulate's table: each code dequantized in float32, LiteRT's
  float32 GELU (erf, or the tanh approximation), times ``1 / s_y``, rounded half away from zero.
* ABS, EXP, LOG, SQRT: tables over the 256 input codes (``unary_table``).
* RSQRT (``elementwise.cc``): a table over the 256 input codes: ``v = x - zp_x``; 127 where v is 0
  (and where it is negative, which LiteRT refuses at run time); else gemmlowp's inverse square
  root of v (``inv_sqrt_multiplier``) applied to 1 shifted up 20 bits, then the multiplier of
  ``1 / (sqrt(s_x) s_y)`` (the square root and product in float32, the reciprocal in double) and
  the 20 bits back, plus zp_y.
* SQUARED_DIFFERENCE (``squared_difference.cc``, quantization kind "squared_difference"): each
  operand ``(x - zp) << 7`` rescaled by ``s / (2 max(s_a, s_b))`` (a multiplier below one, one
  rounding right shift), the difference squared in int32, then requantized by
  ``(2 max(s_a, s_b))^2 / (2^14 s_y)``, plus zp_y, saturated.
"""

from __future__ import annotations

import numpy as np
import torch

from ..sim.int_ops import requantize_fixedpoint
from .fixedpoint import round_half_away
from .gemmlowp import inv_sqrt_multiplier
from .requant import quantize_multiplier

_F32 = np.float32
SQUARED_DIFFERENCE_LEFT_SHIFT = 7


def rsqrt_table(xq, yq) -> np.ndarray:
    """LiteRT's int8 RSQRT of every input code (-128..127) -> output codes."""
    mult, shift = quantize_multiplier(1.0 / np.float64(_F32(np.sqrt(_F32(xq.scale))) * _F32(yq.scale)))
    value = np.arange(-128, 128, dtype=np.int64) - int(xq.zero_point)
    inv_a, inv_b = inv_sqrt_multiplier(np.maximum(value, 1))
    data = requantize_fixedpoint(torch.ones(value.shape, dtype=torch.int64), torch.from_numpy(inv_a),
                                 torch.from_numpy(inv_b + 20))
    out = requantize_fixedpoint(data, int(mult), int(shift) - 20).numpy() + int(yq.zero_point)
    return np.where(value > 0, np.clip(out, -128, 127), 127).astype(np.int8)


def _gelu_f32(x: torch.Tensor, approximate: bool) -> torch.Tensor:
    """LiteRT's GeluTransform / GeluTransformApproximate, in float32 as its C++ computes them."""
    if approximate:
        cubic = x + torch.tensor(np.float32(0.044715)) * x * x * x
        inner = torch.tensor(np.float32(2 / np.sqrt(np.pi) * np.sqrt(0.5))) * cubic
        return (0.5 * x) * (1 + torch.tanh(inner))
    return (0.5 * x) * (1 + torch.erf(x * torch.tensor(np.float32(np.sqrt(0.5)))))


def lut_populate(xq, yq, transform) -> np.ndarray:
    """LiteRT's LUTPopulate for int8: every code dequantized in float32, ``transform`` (float32 array
    -> float32 array), times 1 / s_y in float32, rounded half away from zero, plus zp_y, saturated."""
    codes = np.arange(-128, 128, dtype=np.int64)
    x = (_F32(xq.scale) * (codes - int(xq.zero_point)).astype(np.float32)).astype(np.float32)
    y = np.asarray(transform(x), np.float32) * (_F32(1) / _F32(yq.scale))
    return np.clip(round_half_away(y) + int(yq.zero_point), -128, 127).astype(np.int8)


def gelu_table(xq, yq, approximate: bool) -> np.ndarray:
    """LiteRT's int8 GELU: LUTPopulate of its float32 GELU."""
    return lut_populate(xq, yq, lambda x: _gelu_f32(torch.from_numpy(x), approximate).numpy())


def _correctly_rounded(fn):
    """A float32 function as C's libm gives it (correctly rounded): computed in double, rounded once."""
    return lambda x: fn(x.astype(np.float64)).astype(np.float32)


def unary_table(op: str, xq, yq) -> np.ndarray:
    """LiteRT's int8 kernel of a unary op over every code: ABS (``elementwise.cc``) takes |x - zp_x|,
    requantized by ``s_x / s_y`` unless the scales are equal, plus zp_y; EXP and LOG are LUTPopulate
    tables of libm's float32 function (LOG of a value <= 0 gives the output's least value); SQRT is
    ``trunc(sqrt(x) * (1 / s_y)) + zp_y`` in float32 (of a negative value, which LiteRT refuses at
    run time, 0)."""
    if op == "Abs":
        value = np.abs(np.arange(-128, 128, dtype=np.int64) - int(xq.zero_point))
        if _F32(xq.scale) != _F32(yq.scale):
            mult, shift = quantize_multiplier(np.float64(_F32(xq.scale) / _F32(yq.scale)))
            value = requantize_fixedpoint(torch.from_numpy(value), int(mult), int(shift)).numpy()
        return np.clip(value + int(yq.zero_point), -128, 127).astype(np.int8)
    if op == "Sqrt":  # truncated, not rounded: fitted to LiteRT 2.3.0 (every code, 40 seeded scale pairs)
        x = (_F32(xq.scale) * (np.arange(-128, 128) - int(xq.zero_point)).astype(np.float32)).astype(np.float32)
        y = _correctly_rounded(np.sqrt)(np.maximum(x, 0)) * (_F32(1) / _F32(yq.scale))
        return np.clip(np.trunc(y) + int(yq.zero_point), -128, 127).astype(np.int8)
    least = _F32((-128 - int(yq.zero_point)) * _F32(yq.scale))
    transforms = {"Exp": _correctly_rounded(np.exp),
                  "Log": lambda x: np.where(x <= 0, least, _correctly_rounded(np.log)(np.maximum(x, _F32(1e-30))))}
    return lut_populate(xq, yq, transforms[op])


def quantize_integers(graph, node, add) -> None:
    """SQUARED_DIFFERENCE's Prepare: the two input multipliers and the output multiplier."""
    qa, qb, qy = (graph.values[n].quant for n in (*node.inputs[:2], node.outputs[0]))
    twice_max = np.float64(_F32(2) * max(_F32(qa.scale), _F32(qb.scale)))
    reals = {"0": np.float64(_F32(qa.scale)) / twice_max, "1": np.float64(_F32(qb.scale)) / twice_max,
             "out": twice_max * twice_max / np.float64(_F32(1 << 2 * SQUARED_DIFFERENCE_LEFT_SHIFT) * _F32(qy.scale))}
    for role, real in reals.items():
        mult, shift = quantize_multiplier(real)
        add(f"multiplier{role}", np.atleast_1d(mult).astype(np.int32))
        add(f"shift{role}", np.atleast_1d(shift).astype(np.int32))


def integer_forward(sim, node, env) -> list:
    integer = lambda role: torch.from_numpy(sim._int(node, role).astype(np.int64))  # noqa: E731
    scaled = []
    for k, name in enumerate(node.inputs[:2]):
        x = sim._as_codes(name, env).to(torch.int64) - int(sim._q(name).zero_point)
        x = requantize_fixedpoint(x << SQUARED_DIFFERENCE_LEFT_SHIFT, integer(f"multiplier{k}"), integer(f"shift{k}"))
        scaled.append(x)
    diff = scaled[0] - scaled[1]
    yq = sim._q(node.outputs[0])
    y = requantize_fixedpoint(diff * diff, integer("multiplierout"), integer("shiftout")) + int(yq.zero_point)
    return [sim._store(y, yq)]
