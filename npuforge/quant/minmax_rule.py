"""Max / Min of activations, Clip with computed bounds and Where between activations
(quantization kind "minmax"): every operand requantized to the output's grid, then the
maximum / minimum of the codes, or the codes the condition selects.

With ``x_k' = x_k - zp_k`` per operand:

    t_k = zp_y + R(x_k'; M_k, s_k),   M_k ~ s_k / s_y
    Max: y = max_k t_k    Min: y = min_k t_k    Clip(x, lo, hi): y = min(max(t_x, t_lo), t_hi)
    Where(c, a, b): y = t_a where c, else t_b

saturated to the output dtype. A constant operand (a per-channel bound, a Clip's constant
bound beside a computed one) is stored as its codes on the output grid (``input{k}``,
``round(c / s_y) + zp_y``): one rounding, as fake-quant and QDQ give it, where it stays
float.

Exactness. Quantizing to the output grid is monotonic (non-decreasing), so it commutes
with max and min: ``q_y(max(a, b)) = max(q_y(a), q_y(b))``; a selection commutes with any
elementwise map. Fake-quant and QDQ compute
``q_y(max(a, b))`` of the operands on their own grids; the rule computes ``max`` of each
operand requantized, each R the real ratio rounded once to within its multiplier's error
(relative 2^-21 or better). They agree but where an operand lands within that of a half
step (ties round up in R, to even in QuantizeLinear). Operands sharing the output's grid
requantize by 1 (``R(x; 2^30, 1) = x``): the codes themselves.

Clip's bounds are scalars (its shape rule): ``Clip(x, ReduceMax(x) - 80)``, an audio
front end's dynamic-range floor, is a Max of x and a computed scalar.
"""

from __future__ import annotations

import numpy as np
import torch

from .requant import requant_multiplier

# op -> how its operands combine, in input order (Clip: x, then max with lo, min with hi)
_COMBINE = {"Max": torch.maximum, "Min": torch.minimum}


def quantize_integers(graph, node, add, config=None) -> None:
    """Each operand's requantization to the output grid, or a constant's output codes. No TFLite
    kernel requantizes a MAXIMUM's operands (under ``target='tflite'`` they share the output's grid,
    a requantization by 1), so ``tflite_multipliers`` keeps npuforge's one-rounding multipliers here."""
    yq = graph.values[node.outputs[0]].quant
    for k, name in enumerate(node.inputs):
        if not name or (node.op == "Where" and k == 0):  # (Where's condition: a bool, as it is)
            continue
        v = graph.values[name]
        if v.is_const:
            add(f"input{k}", yq.quantize(np.asarray(v.data, np.float32)))
            continue
        mult, shift = requant_multiplier(np.atleast_1d(np.float64(v.quant.scale) / np.float64(yq.scale)))
        add(f"multiplier{k}", mult)
        add(f"shift{k}", shift)


def operand_codes(sim, node, k: int, env) -> torch.Tensor:
    """Operand k as output codes (int64, unsaturated)."""
    yq = sim._q(node.outputs[0])
    if f"input{k}" in node.quant:
        return torch.from_numpy(sim._int(node, f"input{k}").astype(np.int64))
    name = node.inputs[k]
    q = sim._q(name)
    x = sim._as_codes(name, env).to(torch.int64) - int(q.zero_point)
    if sim.rounding == "onnx":  # QDQ: dequantized (float32), then QuantizeLinear to the output grid
        return torch.from_numpy(yq.quantize(x.to(torch.float32).numpy() * np.float32(q.scale)).astype(np.int64))
    m, s = int(sim._int(node, f"multiplier{k}")[0]), int(sim._int(node, f"shift{k}")[0])
    return sim._R(x, m, s) + int(yq.zero_point)


def integer_forward(sim, node, env) -> list:
    yq = sim._q(node.outputs[0])
    if node.op == "Clip":
        y = operand_codes(sim, node, 0, env)
        for k, combine in ((1, torch.maximum), (2, torch.minimum)):
            if len(node.inputs) > k and node.inputs[k]:
                y = combine(y, operand_codes(sim, node, k, env))
    elif node.op == "Where":
        y = torch.where(sim._get(node.inputs[0], env), operand_codes(sim, node, 1, env), operand_codes(sim, node, 2, env))
    else:
        combine = _COMBINE[node.op]
        y = operand_codes(sim, node, 0, env)
        for k in range(1, len(node.inputs)):
            y = combine(y, operand_codes(sim, node, k, env))
    return [sim._store(y, yq)]
