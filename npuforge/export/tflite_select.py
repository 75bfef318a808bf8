"""TFLite mappings of a comparison of an activation with a constant (GREATER, GREATER_EQUAL,
LESS, LESS_EQUAL, EQUAL) and of Where (SELECT_V2): what an If on a score imports
as (a wake-word model that runs its verifier when its own score passes a threshold).

The integer program compares the dequantized codes with the constant in float32 (the
comparison has no quantization rule: its bool output needs none), so on an activation's
256 codes the outcome is a set of codes the exporter can write down exactly. LiteRT's int8
comparison kernels (``comparisons.cc``) rescale both operands before comparing them:

    f(x) = MultiplyByQuantizedMultiplierSmallerThanOneExp((x - zp) << 8, M, shift),  (M, shift) = QuantizeMultiplier(s)

so the constant is written as a code ``t`` on the activation's own grid, the one whose
outcome ``op(f(x), f(t))`` equals the integer program's on every code (searched among the
256, with f emulated here; checked against LiteRT in tests/test_tflite_select.py). A
constant every code lies on one side of (a threshold beyond the calibrated range) is the
same outcome written as ``x >= lowest code`` or ``x < lowest code``. Where no code
reproduces it (a scale below 2^-8, where f merges neighbouring codes at the threshold),
the export is refused, naming the node.
"""

from __future__ import annotations

import numpy as np

from ..quant.fixedpoint import doubling_high_mul, rdbp
from ..quant.requant import quantize_multiplier
from .tflite_layout import refuse

COMPARISONS = {"Greater": ("GREATER", np.greater), "GreaterOrEqual": ("GREATER_EQUAL", np.greater_equal),
               "Less": ("LESS", np.less), "LessOrEqual": ("LESS_EQUAL", np.less_equal),
               "Equal": ("EQUAL", np.equal)}
_LEFT_SHIFT = 8  # comparisons.cc


def litert_rescaled(codes: np.ndarray, zero_point: int, scale: float) -> np.ndarray:
    """LiteRT's int8 comparison operand: ``(x - zp) << 8`` times the scale, in fixed point."""
    m, e = quantize_multiplier(np.float64(scale))
    x = (np.asarray(codes, np.int64) - int(zero_point)) << _LEFT_SHIFT
    if int(e) > 0:
        x = x << int(e)
    return rdbp(doubling_high_mul(x, int(m)), max(0, -int(e)))


def threshold_code(op: str, codes: np.ndarray, outcome: np.ndarray, zero_point: int, scale: float,
                   constant_first: bool) -> int | None:
    """The code ``t`` on the activation's grid whose LiteRT comparison with each of ``codes``
    gives ``outcome``; None if no code does."""
    compare = COMPARISONS[op][1]
    fx = litert_rescaled(codes, zero_point, scale)
    ft = litert_rescaled(codes, zero_point, scale)  # the candidates: every code
    for t, f in zip(codes, ft):
        got = compare(f, fx) if constant_first else compare(fx, f)
        if np.array_equal(got, outcome):
            return int(t)
    return None


def comparison(ex, node) -> None:
    """A comparison of an int8 activation with a constant (either order): the constant as the
    code on the activation's grid that reproduces the integer program on every code."""
    a, b = node.inputs[:2]
    va, vb = ex.g.values[a], ex.g.values[b]
    if va.is_const == vb.is_const:
        refuse(node, "it compares two activations or two constants (npuforge writes an activation against a "
                     "constant)")
    x, c = (b, a) if va.is_const else (a, b)
    constant = np.asarray(ex.g.values[c].data)
    if constant.size != 1:
        refuse(node, f"its constant '{c}' has {constant.size} elements (one is written)")
    stored = ex.g.values[x].quant  # the IR's grid (uint8 or int8): what the integer program dequantizes
    p = ex.qp(x)  # the file's (int8)
    ir_codes = np.arange(stored.qmin, stored.qmax + 1, dtype=np.int64)
    real = (ir_codes - int(stored.zero_point)).astype(np.float32) * np.float32(stored.scale)
    value = np.float32(constant.reshape(-1)[0])
    compare = COMPARISONS[node.op][1]
    outcome = compare(value, real) if va.is_const else compare(real, value)
    codes = ir_codes - (128 if stored.dtype == "uint8" else 0)
    op, constant_first = node.op, va.is_const
    if outcome.all() or not outcome.any():
        # every code on one side (a threshold beyond the calibrated range): x >= lowest code, or x < it
        op, constant_first = ("GreaterOrEqual" if outcome.all() else "Less"), False
    t = threshold_code(op, codes, outcome, int(p.zero_point), float(p.scale), constant_first)
    if t is None:
        refuse(node, f"no int8 constant reproduces it in LiteRT's {COMPARISONS[op][0]} (the scale "
                     f"{float(p.scale):.3g} is too fine for its rescaling at the threshold)")
    operands = [ex.activation(x), ex.const(f"{node.name}::threshold", np.full((), t, np.int64), p.dtype,
                                           ex.quant(p))]
    ex.op(COMPARISONS[op][0], operands[::-1] if constant_first else operands, [ex.activation(node.outputs[0])],
          version=2)


def select(ex, node) -> None:
    """Where of two activations (or an activation and a constant): SELECT_V2 of codes, every
    operand on the output's grid (``--target tflite`` shares it)."""
    cond, y = node.inputs[0], node.outputs[0]
    rank = len(ex.dims(y))
    for name in (cond, *node.inputs[1:]):
        if len(ex.dims(name)) not in (0, rank) or (rank == 4 and ex.dims(name) != ex.dims(y) and
                                                   int(np.prod(ex.dims(name))) != 1):
            refuse(node, f"operand '{name}' would broadcast across the file's NHWC layout")
    ex.op("SELECT_V2", [ex.activation(cond), ex.grid_operand(node, 1), ex.grid_operand(node, 2)],
          [ex.activation(y)], "SelectV2Options")
