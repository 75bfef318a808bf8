"""gemmlowp / TFLite fixed-point primitives on NumPy int64 arrays holding int32 (or int16)
values, as TFLite's reference kernels compute them (the torch versions the integer
simulator runs are in npuforge/sim/int_ops.py)."""

from __future__ import annotations

import numpy as np


def round_half_away(x) -> np.ndarray:
    """TfLiteRound: to the nearest integer, ties away from zero."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def c_div(num, den: int) -> np.ndarray:
    """C's integer division: the quotient truncated toward zero (exact on int64)."""
    num = np.asarray(num, np.int64)
    q = np.abs(num) // den
    return np.where(num < 0, -q, q)


def doubling_high_mul(a, b, bits: int = 32, rounding: bool = True) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on ``bits``-bit values (rounding=False:
    the truncating SaturatingDoublingHighMul): the high half of 2 * a * b."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    half = 1 << (bits - 2)
    nudge = np.where(ab >= 0, half, 1 - half) if rounding else 0
    out = c_div(ab + nudge, 1 << (bits - 1))
    low = -(1 << (bits - 1))
    return np.where((a == low) & (b == low), (1 << (bits - 1)) - 1, out)


def rdbp(x, e) -> np.ndarray:
    """RoundingDivideByPOT: x / 2^e rounded half away from zero; ``e`` a number or an array."""
    x = np.asarray(x, np.int64)
    e = np.broadcast_to(np.asarray(e, np.int64), x.shape)
    mask = (np.int64(1) << e) - 1
    return np.where(e > 0, (x >> e) + ((x & mask) > ((mask >> 1) + (x < 0))), x)
