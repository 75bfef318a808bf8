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


def activation_code_bounds(node, p) -> tuple:
    """Saturation bounds, in the output's integer domain, of a Conv / Gemm with
    a fused Relu or Clip: ``zp + round(bound / scale)`` within the type's
    range. Ints, or int64 arrays (one per output channel) for per-channel Clip
    bounds. A fused Relu / Clip is nothing but tighter saturation."""
    from ..ops.activation import fused_clip_bounds

    bounds = fused_clip_bounds(node)
    if bounds is None:
        return p.qmin, p.qmax
    zp, scale = int(p.zero_point), np.float32(p.scale)

    def code(bound):
        steps = np.clip(np.rint(np.float32(bound) / scale), -2.0**40, 2.0**40)  # inf -> beyond any range
        q = np.clip(zp + steps, p.qmin, p.qmax).astype(np.int64)
        return int(q) if q.ndim == 0 else q

    return code(bounds[0]), code(bounds[1])
