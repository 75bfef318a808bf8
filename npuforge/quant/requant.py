"""Fixed-point requantization multipliers, as gemmlowp / TFLite define them.

A real multiplier m > 0 is stored as an int32 ``multiplier`` in [2^30, 2^31)
(a Q0.31 number in [0.5, 1)) and an int32 ``shift``:

    m ~= multiplier * 2^(shift - 31)

``shift`` > 0 is a left shift (m >= 1), < 0 a right shift. The relative
error is at most 2^-31.
"""

from __future__ import annotations

import numpy as np


def quantize_multiplier(m) -> tuple[np.ndarray, np.ndarray]:
    m = np.asarray(m, np.float64)
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        raise ValueError("requantization multipliers must be finite and non-negative")
    frac, exp = np.frexp(m)  # m = frac * 2^exp, frac in [0.5, 1)
    q = np.rint(frac * 2.0**31).astype(np.int64)
    carry = q == 2**31  # frac rounded up to 1.0
    q = np.where(carry, q // 2, q)
    exp = np.where(carry, exp + 1, exp)
    zero = m == 0
    q = np.where(zero, 0, q)
    exp = np.where(zero, 0, exp)
    return q.astype(np.int32), exp.astype(np.int32)


def multiplier_value(multiplier, shift) -> np.ndarray:
    return np.asarray(multiplier, np.float64) * 2.0 ** (np.asarray(shift, np.float64) - 31)
