"""TFLite's int8 SOFTMAX (its reference kernel), for graphs quantized with TFLite's arithmetic.

gemmlowp fixed point throughout, on int64 arrays holding int32 values:

1. ``d = q - max(q)`` along the axis; ``d`` below ``diff_min`` contributes nothing;
2. ``d`` rescaled to Q5.26 by ``beta * s_x * 2^26`` (``input_multiplier``, ``input_left_shift``);
3. ``exp`` of it, gemmlowp's ``exp_on_negative_values``: a Taylor polynomial on [-1/4, 0)
   and a barrel shifter of exp(-2^k) constants;
4. the sum in Q12.19, its reciprocal by Newton-Raphson (``one_over_one_plus_x_for_x_in_0_1``);
5. ``y = RoundingDivideByPOT(exp * reciprocal, bits_over_unit + 23) - 128``, saturated.

The output grid is fixed (scale 1/256, zero point -128), as TFLite requires.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import NpuforgeError
from . import gemmlowp
from .fixedpoint import doubling_high_mul as srdhm, rdbp
from .params import QParams
from .requant import quantize_multiplier

SCALED_DIFF_BITS = 5  # integer bits of the rescaled difference (Q5.26)
ACCUMULATION_BITS = 12  # integer bits of the sum of exps (Q12.19)


def _wrap(x) -> np.ndarray:
    """int32 wrap-around of raw fixed-point additions (gemmlowp adds raw int32 values)."""
    return gemmlowp.wrap(x, 32)


def exp_on_negative_values(a: np.ndarray) -> np.ndarray:
    """gemmlowp's exp of a non-positive Q5.26 value, as Q0.31."""
    return gemmlowp.exp_on_negative(a, SCALED_DIFF_BITS, 32)


def one_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    """1 / (1 + a) for a Q0.31 a in [0, 1), as Q0.31 (Newton-Raphson in Q2.29)."""
    return gemmlowp.one_over_one_plus_x(a, 32)


def reciprocal(total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GetReciprocal of a positive Q12.19 sum: (Q0.31 scale, bits over unit)."""
    total = np.asarray(total, np.int64)
    headroom = 32 - np.frexp(np.maximum(total, 1).astype(np.float64))[1].astype(np.int64)  # clz of the uint32
    bits_over_unit = ACCUMULATION_BITS - headroom
    shifted_minus_one = _wrap(((total << headroom) & 0xFFFFFFFF) - (1 << 31))
    return one_over_one_plus_x(shifted_minus_one), bits_over_unit


# the smallest input step TFLite's SOFTMAX takes: its Prepare (QuantizeMultiplierGreaterThanOne) aborts
# unless beta * s_x * 2^26 is above one, so with beta 1 the float32 step just above 2^-26
SMALLEST_STEP = np.nextafter(np.float32(2.0 ** -(31 - SCALED_DIFF_BITS)), np.float32(1))


def input_real(scale, beta: float = 1.0) -> float:
    """beta * s_x * 2^26, the real multiplier TFLite's SOFTMAX Prepare derives (it must be above one)."""
    return min(beta * np.float64(np.float32(scale)) * (1 << (31 - SCALED_DIFF_BITS)), (1 << 31) - 1.0)


def widen_small_steps(graph, plan, log) -> None:
    """``target='tflite'``: a Softmax whose input step is below ``SMALLEST_STEP`` (a near-constant
    input: attention logits of random weights) gets that step on its input's whole sharing group,
    before any node's integers are derived from the grids; noted through ``log``. The input's range
    stays covered; the softmax of inputs that close is uniform far below its output step 1/256."""
    for node in graph.nodes:
        p = graph.values[node.inputs[0]].quant if node.op == "Softmax" and node.name in plan.kinds else None
        if p is None or p.per_channel or input_real(p.scale) > 1.0:
            continue
        lo = (p.qmin - int(p.zero_point)) * np.float64(p.scale)
        spread = (p.qmax - p.qmin) * np.float64(p.scale)
        zero_point = int(np.clip(np.rint(p.qmin - lo / np.float64(SMALLEST_STEP)), p.qmin, p.qmax))
        wider = QParams(p.dtype, SMALLEST_STEP, zero_point)
        root = plan.find(node.inputs[0])
        for name in plan.activations | plan.constants:
            if plan.find(name) == root:
                graph.values[name].quant = wider
        log(f"node '{node.name}' ({node.op}): its input step {float(p.scale):.3g} (a near-constant input, range "
            f"{spread:.3g}) is below the 2^-{31 - SCALED_DIFF_BITS} that TFLite's integer SOFTMAX takes; widened "
            f"to {float(SMALLEST_STEP):.4g} (its softmax is uniform to {spread:.1g}, far below the output step "
            f"1/256)")


def quantize_integers(graph, node, add, beta: float = 1.0) -> None:
    """Store TFLite's SOFTMAX Prepare values: input multiplier, left shift, diff_min."""
    xp = graph.values[node.inputs[0]].quant
    real = input_real(xp.scale, beta)
    if not real > 1.0:  # TFLite's Prepare takes a multiplier above one: an input step above 2^-26
        raise NpuforgeError(f"node '{node.name}' ({node.op}): its input step {float(xp.scale):.3g} is not above "
                            f"the 2^-{31 - SCALED_DIFF_BITS} that TFLite's integer SOFTMAX takes (a near-constant "
                            f"input); quantize with target 'tflite' (which widens it), keep it in float "
                            f"(keep_float) or quantize without tflite_multipliers")
    m, shift = quantize_multiplier(np.float64(real))
    radius = ((1 << SCALED_DIFF_BITS) - 1) * (1 << (31 - SCALED_DIFF_BITS)) / (1 << int(shift))
    add("tflite_softmax", np.asarray(1, np.int32))
    add("multiplier", np.asarray(m, np.int32))
    add("shift", np.asarray(shift, np.int32))
    add("diff_min", np.asarray(-int(np.floor(radius)), np.int32))


def integer_forward(sim, node, env) -> list:
    q = sim._as_codes(node.inputs[0], env).to(torch.int64).numpy()
    axis = node.attrs["axis"] % q.ndim
    m, shift = int(sim._int(node, "multiplier")), int(sim._int(node, "shift"))
    diff_min = int(sim._int(node, "diff_min"))
    d = q - q.max(axis=axis, keepdims=True)
    used = d >= diff_min
    e = exp_on_negative_values(srdhm(np.maximum(d, diff_min) * (1 << shift), m))
    total = np.where(used, rdbp(e, ACCUMULATION_BITS), 0).sum(axis=axis, keepdims=True)
    scale, bits = reciprocal(total)
    y = rdbp(srdhm(scale, e), bits + 31 - 8) - 128
    p = sim._q(node.outputs[0])
    y = np.where(used, y, -128) + (int(p.zero_point) + 128)  # a uint8 output: the same codes + 128
    return [sim._store(torch.from_numpy(y), p)]
