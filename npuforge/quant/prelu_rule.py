"""The integer PRelu (quantization kind "prelu"): two requantizations, as a fused LeakyRelu
and TFLite's int8 PRELU compute it, with the slope an int8 constant.

With ``x' = x - zp_x`` and ``a' = a - zp_a`` the slope's code (broadcast to x as the
float slope is):

    y = zp_y + R(x'; M_1, s_1)          where x' >= 0,   M_1 ~ s_x / s_y
    y = zp_y + R(x' a'; M_2, s_2)       elsewhere,       M_2 ~ s_x s_a / s_y

saturated to the output dtype. The slope is quantized symmetric int8 ([-127, 127]), one
scale per channel where it varies along one axis only (``nn.PReLU(C)``'s ``[C, 1, 1]``,
a TFLite model's ``[1, 1, C]``): each channel's slope is then its code 127 times its own
scale, exact to float32 rounding, and M_2 is per channel. A slope that varies along
several axes (Keras' default PReLU: one slope per element) gets one scale; so does every
slope under ``tflite_multipliers``, as TFLite's PRELU takes one alpha scale and zero
point (its Prepare computes both ratios in float32, here too). A slope that already has
parameters (an int8 TFLite import) keeps them.

Fake-quant and QDQ compute ``fq_y(x >= 0 ? x : x * a)`` with x and a on their grids:
the same real number rounded once, so the integer result differs from theirs only where
the product lands within the multiplier's error of a half step (ties round up in R, to
even in QuantizeLinear). The ``onnx`` rounding mode computes that float program.
"""

from __future__ import annotations

import numpy as np
import torch

from .params import QParams, weight_params
from .requant import requant_multiplier


def slope_axis(shape, tflite: bool) -> int | None:
    """The slope's one axis of more than one element, or None (one scale for all)."""
    axes = [k for k, d in enumerate(shape) if d != 1]
    return axes[0] if len(axes) == 1 and not tflite else None


def slope_params(graph, node, tflite: bool) -> QParams:
    slope = graph.values[node.inputs[1]]
    if slope.quant is not None:
        return slope.quant
    data = np.asarray(slope.data, np.float32)
    return weight_params(data, slope_axis(data.shape, tflite))


def _per_channel(arr: np.ndarray, p: QParams, ndim: int) -> np.ndarray:
    """A per-channel array of the slope's parameters shaped to broadcast as the slope does."""
    return arr if p.axis is None else p._broadcast(arr, ndim)


def quantize_integers(graph, node, add, config=None) -> None:
    """The slope's parameters (on its value) and the two requantizations of one PRelu node."""
    tflite = bool(config is not None and config.tflite_multipliers)
    xq, yq = graph.values[node.inputs[0]].quant, graph.values[node.outputs[0]].quant
    slope = graph.values[node.inputs[1]]
    slope.quant = aq = slope_params(graph, node, tflite)
    if tflite:  # LiteRT's Prepare: float32 ratios
        f32 = np.float32
        m_pos = np.float64(f32(xq.scale) / f32(yq.scale))
        m_neg = (f32(xq.scale) * aq.scale.astype(f32) / f32(yq.scale)).astype(np.float64)
    else:
        m_pos = np.float64(xq.scale) / np.float64(yq.scale)
        m_neg = np.float64(xq.scale) * aq.scale.astype(np.float64) / np.float64(yq.scale)
    for role, m in (("", m_pos), ("_neg", m_neg)):
        mult, shift = requant_multiplier(np.atleast_1d(m), tflite)
        rank = len(slope.shape)
        if role and aq.axis is not None:
            mult, shift = (_per_channel(v, aq, rank) for v in (mult, shift))
        add(f"multiplier{role}", mult)
        add(f"shift{role}", shift)


def integer_forward(sim, node, env) -> list:
    xq, aq, yq = (sim._q(n) for n in (node.inputs[0], node.inputs[1], node.outputs[0]))
    x = sim._as_codes(node.inputs[0], env).to(torch.int64) - int(xq.zero_point)
    codes = sim._get(node.inputs[1], env).to(torch.int64)
    a = codes - torch.from_numpy(_per_channel(aq.zero_point.astype(np.int64), aq, codes.dim()))
    if sim.rounding == "onnx":  # ONNX Runtime's QDQ PRelu: float32 on the dequantized codes, quantized
        s_a = torch.from_numpy(_per_channel(aq.scale.astype(np.float32), aq, codes.dim()))
        xf, af = x.to(torch.float32) * torch.tensor(np.float32(xq.scale)), a.to(torch.float32) * s_a
        y = torch.from_numpy(yq.quantize(torch.where(xf >= 0, xf, xf * af).numpy()))
        return [y]
    R = sim._R
    pos = R(x, torch.from_numpy(sim._int(node, "multiplier").astype(np.int64)),
            torch.from_numpy(sim._int(node, "shift").astype(np.int64)))
    neg = R(x * a, torch.from_numpy(sim._int(node, "multiplier_neg").astype(np.int64)),
            torch.from_numpy(sim._int(node, "shift_neg").astype(np.int64)))
    return [sim._store(torch.where(x >= 0, pos, neg) + int(yq.zero_point), yq)]
