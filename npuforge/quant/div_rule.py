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
    """Q(a * mult * 2^(shift - 31) / b) on int64 codes (``a``, ``b`` less their zero points), ties
    away from zero; b = 0: +-2^40 by a's sign (saturates any output), 0 for 0 / 0."""
    num = a * mult
    den = b.clone()
    e = shift - 31
    if e >= 0:
        num = num << e
    else:
        den = den << -e
    sign = torch.where((num < 0) ^ (den < 0), -1, 1)
    n, d = num.abs(), den.abs()
    q = sign * torch.div(2 * n + d, 2 * torch.where(d == 0, 1, d), rounding_mode="floor")
    infinite = torch.where(a > 0, 1 << 40, torch.where(a < 0, -(1 << 40), 0))
    return torch.where(b == 0, infinite, q)


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
