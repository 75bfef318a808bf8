"""Integer arithmetic of the simulator: fixed-point requantization (gemmlowp /
TFLite), ONNX-style float requantization, rounded division, and exact integer
convolution / matrix products on float kernels where exactness is proven.

Every function here works on torch tensors holding integers (int64 unless
said otherwise) and is written so that its result does not depend on the
kernel that runs it: float kernels are used only inside the proven-exact
range (see :func:`exact_float_dtype`).
"""

from __future__ import annotations

import numpy as np
import torch

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

TORCH_INT = {"int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32}
NP_INT = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32}

# float32 represents every integer of magnitude <= 2^24 exactly, float64 every one <= 2^53
FLOAT32_EXACT = 2**24
FLOAT64_EXACT = 2**53


def exact_float_dtype(bound: int):
    """The narrowest float dtype in which a sum of integer products is exact.

    Proof. Let an accumulator be ``acc = b + sum_k w_k * x_k`` with integers
    ``b``, ``w_k``, ``x_k`` (here ``x_k`` already has its zero point removed,
    so padding contributes 0). Every partial sum taken in *any* order, and
    every single product, is bounded in magnitude by
    ``B = |b| + sum_k |w_k| * max|x_k|``. A binary float format with a p-bit
    significand represents every integer of magnitude <= 2^p exactly, and the
    exact sum or product of two such integers that is itself <= 2^p in
    magnitude is representable, so IEEE round-to-nearest returns it exactly.
    By induction over the summation tree (whatever order, blocking or
    vectorisation the kernel uses, including fused multiply-add), every
    intermediate result is the exact integer, hence so is the result, if
    ``B <= 2^24`` (float32, p = 24) or ``B <= 2^53`` (float64, p = 53).

    The simulator uses the per-output-channel bound
    ``B_c = |bias_c| + (sum_k |w_ck|) * max|x - zp|`` (the L1 norm of the
    channel's integer weights times the largest input magnitude the input
    dtype and zero point allow), which is at most ``K * max|w| * max|x - zp|``
    and much tighter in practice. Returns torch.float32, torch.float64, or None
    (use exact int64 arithmetic).
    """
    if bound <= FLOAT32_EXACT:
        return torch.float32
    if bound <= FLOAT64_EXACT:
        return torch.float64
    return None


def max_abs_code(p) -> int:
    """max |q - zero_point| over the codes of a QParams' dtype (a pure function of its integers)."""
    zp = np.asarray(p.zero_point, np.int64)
    return int(np.max(np.maximum(zp - p.qmin, p.qmax - zp)))


# -- fixed-point requantization -------------------------------------------------------


def value_code(value: float, p) -> int:
    """The code of a float constant on the per-tensor grid ``p`` as the integer program takes it
    (a Pad's fill value): float32 division by the scale, rounded half to even, the zero point
    added, saturated; 0.0 is the zero point exactly."""
    return int(np.clip(np.rint(np.float32(value) / np.float32(p.scale)) + int(p.zero_point), p.qmin, p.qmax))


def saturate_int32(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(INT32_MIN, INT32_MAX)


def requantize_fixedpoint(acc: torch.Tensor, multiplier, shift, saturate: bool = True) -> torch.Tensor:
    """round(acc * multiplier * 2^(shift - 31)) the way gemmlowp / TFLite compute it
    (``MultiplyByQuantizedMultiplier``), on int64 tensors holding int32 values:

    1. ``x = saturate_int32(saturate_int32(acc) * 2^max(shift, 0))``;
    2. ``y = SaturatingRoundingDoublingHighMul(x, multiplier)``: the high 32 bits of
       ``2 * x * multiplier`` rounded, i.e. ``floor((x * multiplier + 2^30) / 2^31)``
       (ties toward +infinity: gemmlowp's nudge-and-truncate is exactly this; its
       one overflow case, both operands INT32_MIN, cannot occur since
       ``multiplier >= 0``);
    3. ``RoundingDivideByPOT(y, e)`` with ``e = max(-shift, 0)``: ``y / 2^e`` rounded
       half away from zero, ``floor((y + 2^(e-1) - [y < 0]) / 2^e)`` for e > 0.

    Computed in one step (fewer passes over the tensor): with ``t = x * multiplier``
    and ``u = t + 2^30``, step 2 is ``floor(u / 2^31)`` and, since
    ``floor((floor(u / a) + c) / b) = floor((u + c * a) / (a * b))`` for integers
    u, c and a, b > 0, steps 2-3 give ``floor((t + 2^30 + 2^(30+e) - 2^31 * [t < -2^30]) / 2^(31+e))``
    (``y < 0`` exactly when ``u < 0``). ``multiplier``/``shift`` are int64 tensors
    (or ints) broadcastable to ``acc``; |t| < 2^62 so nothing overflows int64.
    ``saturate=False`` skips step 1's first saturation when the caller has proven
    that ``acc`` fits int32.
    """
    multiplier = torch.as_tensor(multiplier, dtype=torch.int64)
    shift = torch.as_tensor(shift, dtype=torch.int64)
    x = saturate_int32(acc) if saturate else acc
    if bool((shift > 0).any()):
        x = saturate_int32(x << shift.clamp(min=0))
    e = (-shift).clamp(min=0)
    t = x * multiplier
    if not bool((e > 0).any()):
        return t.add_(1 << 30).bitwise_right_shift_(31)
    every = bool((e > 0).all())
    pos = (e > 0).to(torch.int64)
    const = (1 << 30) + (((1 << (30 + e)) if e.dim() or int(e) else 0) * pos)
    neg = (t < -(1 << 30)).to(torch.int64).bitwise_left_shift_(31)
    t.add_(const)
    t.sub_(neg if every else neg * pos)
    return t.bitwise_right_shift_(31 + e)


def requantize_single(acc: torch.Tensor, multiplier, shift, saturate: bool = True) -> torch.Tensor:
    """Single-rounding requantization (TFLite's ``TFLITE_SINGLE_ROUNDING``, CMSIS-NN's
    single-rounding option, a 32x32->64-bit multiply and one rounding shift):
    ``floor((saturate_int32(acc) * multiplier + 2^(30 - shift)) / 2^(31 - shift))``,
    i.e. round(acc * m) with ties toward +infinity; needs shift <= 30."""
    multiplier = torch.as_tensor(multiplier, dtype=torch.int64)
    total = 31 - torch.as_tensor(shift, dtype=torch.int64)
    if bool((total < 1).any()):
        raise ValueError("single-rounding requantization needs shift <= 30")
    t = (saturate_int32(acc) if saturate else acc) * multiplier
    return t.add_(1 << (total - 1)).bitwise_right_shift_(total)


def requantize_fixedpoint_steps(acc: torch.Tensor, multiplier, shift) -> torch.Tensor:
    """:func:`requantize_fixedpoint` step by step (steps 1-3 of its docstring), for cross-checks."""
    multiplier = torch.as_tensor(multiplier, dtype=torch.int64)
    shift = torch.as_tensor(shift, dtype=torch.int64)
    x = saturate_int32(saturate_int32(acc) << shift.clamp(min=0))
    y = (x * multiplier + (1 << 30)) >> 31
    return rounding_divide_by_pot(y, (-shift).clamp(min=0))


def rounding_divide_by_pot(y: torch.Tensor, exponent) -> torch.Tensor:
    """gemmlowp's RoundingDivideByPOT: y / 2^exponent rounded half away from zero
    (``floor((y + 2^(e-1) - [y < 0]) / 2^e)`` for e > 0; y itself for e = 0)."""
    e = torch.as_tensor(exponent, dtype=torch.int64)
    if not bool((e > 0).any()):
        return y
    half = (1 << e) >> 1
    return (y + half - ((y < 0) & (e > 0)).to(torch.int64)) >> e


def rounding_divide(num: torch.Tensor, den) -> torch.Tensor:
    """num / den rounded half away from zero (den > 0), exact on int64."""
    den = torch.as_tensor(den, dtype=torch.int64)
    q = (2 * num.abs() + den) // (2 * den)
    return torch.where(num < 0, -q, q)


def requantize_onnx(acc: torch.Tensor, scale: np.ndarray) -> torch.Tensor:
    """The ONNX QLinear rule as ONNX Runtime computes it: float32(acc) * scale in
    float32, rounded half to even (int64 result; add the zero point and saturate after)."""
    s = torch.from_numpy(np.asarray(scale, np.float32))
    return torch.round(acc.to(torch.float32) * s).to(torch.int64)


# -- exact integer kernels ----------------------------------------------------------------


def conv_int64(x: np.ndarray, w: np.ndarray, strides, pads, dilations, group: int) -> np.ndarray:
    """Plain int64 N-d convolution (no float anywhere): x [N, C, *S] int64 (zero point
    removed, so zero padding is exact), w [O, C/group, *K] int64."""
    nsp = x.ndim - 2
    x = np.pad(x.astype(np.int64), [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)])
    w = w.astype(np.int64)
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    k = w.shape[2:]
    og = o // group
    out_sp = [(x.shape[2 + i] - (dilations[i] * (k[i] - 1) + 1)) // strides[i] + 1 for i in range(nsp)]
    y = np.zeros((n, group, og, *out_sp), np.int64)
    wg = w.reshape(group, og, cg, *k)
    for offset in np.ndindex(*k):
        sl = tuple(slice(off * d, off * d + (size - 1) * s + 1, s)
                   for off, d, size, s in zip(offset, dilations, out_sp, strides))
        patch = x[(slice(None), slice(None)) + sl].reshape(n, group, cg, *out_sp)
        tap = wg[(slice(None), slice(None), slice(None)) + offset]  # [group, og, cg]
        y += np.einsum("ngc...,goc->ngo...", patch, tap)
    return y.reshape(n, o, *out_sp)
