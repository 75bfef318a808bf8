"""Div by an activation (quantization kind "divide"): linear attention's ``x / (sum + eps)``,
a normalization written out that is not recognised as one, ``1 / x``.

With ``a' = a - zp_a`` and ``b' = b - zp_b`` (a constant operand: its stored codes)::

    y = zp_y + Q(a' * M * 2^(shift - 31) / b'),    M * 2^(shift - 31) ~ s_a / (s_b * s_y)

where Q rounds the exact rational number to the nearest integer, ties away from zero (one
rounding: numerator and denominator are exact int64 products), saturated to the output's
range. A divisor code at its zero point is a division by zero: the output saturates to the
side of the numerator's sign, and 0 / 0 (NaN in float) is the zero point.

Exactness. Fake-quant and QDQ divide the dequantized operands in float32 and round the
quotient to the output grid once; the rule divides exactly with the ratio of scales rounded
to 31 bits (relative 2^-31), so the two differ only where a quotient lies within about
2^-24 of a half step (both round once). ``onnx`` rounding computes what ONNX Runtime's QDQ
file does: float32 dequantization, float32 division, QuantizeLinear (half to even).
"""

from __future__ import annotations

import numpy as np
import torch

from .requant import requant_multiplier


def quantize_integers(graph, node, add, config=None) -> None:
    """A constant operand's codes, and the multiplier of ``s_a / (s_b s_y)``."""
    qs = [graph.values[n].quant for n in node.inputs[:2]]
    yq = graph.values[node.outputs[0]].quant
    for k, name in enumerate(node.inputs[:2]):
        v = graph.values[name]
        if v.is_const:
            add(f"input{k}", qs[k].quantize(np.asarray(v.data, np.float32)))
    ratio = np.float64(qs[0].scale) / (np.float64(qs[1].scale) * np.float64(yq.scale))
    mult, shift = requant_multiplier(np.atleast_1d(ratio))
    add("multiplier", mult)
    add("shift", shift)


def divide(a: torch.Tensor, b: torch.Tensor, mult: int, shift: int) -> torch.Tensor:
    """Q(a * mult * 2^(shift - 31) / b) on int64 codes (``a``, ``b`` less their zero points, at
    most 16-bit), ties away from zero; b = 0: +-2^40 by a's sign (saturates any output), 0 for 0 / 0.

    In int64 without overflow for every shift a multiplier can have (-31 to 30): |a * mult| < 2^47,
    so a right shift of 48 bits or more leaves every quotient below 1/2 (0), and a left one of 16 or
    more puts every non-zero quotient beyond 2^30 (saturated); in between, numerator and shifted
    divisor stay below 2^63, and the remainder decides the rounding without doubling either."""
    e = shift - 31
    n, d = (a * mult).abs(), b.abs()
    sign = torch.where((a < 0) ^ (b < 0), -1, 1)
    infinite = torch.where(a > 0, 1 << 40, torch.where(a < 0, -(1 << 40), 0))
    if e >= 16:
        q = torch.where(n > 0, 1 << 40, 0)
    elif e <= -48:
        q = torch.zeros_like(n)
    else:
        n, d = (n << e, d) if e >= 0 else (n, d << -e)
        d = torch.where(d == 0, 1, d)
        q = torch.div(n, d, rounding_mode="floor")
        r = n - q * d
        q = q + (r >= d - r).to(q.dtype)  # a remainder of half the divisor or more rounds up (away from zero)
    return torch.where(b == 0, infinite, sign * q)


def _operand(sim, node, k: int, env) -> torch.Tensor:
    q = sim._q(node.inputs[k])
    if f"input{k}" in node.quant:
        codes = torch.from_numpy(sim._int(node, f"input{k}").astype(np.int64))
    else:
        codes = sim._as_codes(node.inputs[k], env).to(torch.int64)
    return codes - int(q.zero_point)


def integer_forward(sim, node, env) -> list:
    qs = [sim._q(n) for n in node.inputs[:2]]
    yq = sim._q(node.outputs[0])
    a, b = _operand(sim, node, 0, env), _operand(sim, node, 1, env)
    if sim.rounding == "onnx":  # QDQ: dequantized in float32, divided, QuantizeLinear
        fa = a.to(torch.float32) * torch.tensor(np.float32(qs[0].scale))
        fb = b.to(torch.float32) * torch.tensor(np.float32(qs[1].scale))
        quotient = torch.nan_to_num(fa / fb, nan=0.0)  # (0 / 0: the zero point; +-inf saturates)
        with np.errstate(over="ignore"):  # (a quotient beyond float32 over the output scale saturates too)
            return [torch.from_numpy(yq.quantize(quotient.numpy()))]
    y = divide(a, b, int(sim._int(node, "multiplier")[0]), int(sim._int(node, "shift")[0]))
    return [sim._store(y + int(yq.zero_point), yq)]
