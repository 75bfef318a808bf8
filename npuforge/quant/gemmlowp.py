"""gemmlowp's fixed-point functions (``fixedpoint.h``) on NumPy int64 arrays holding raw int16 or
int32 values, as TFLite's kernels call them: exp of negative values, 1 / (1 + x) and
(1 - x) / (1 + x) by Newton-Raphson, logistic and tanh, and TFLite's inverse square root.

A raw value with ``integer_bits`` integer bits of a ``bits``-bit type is the real number
``raw / 2^(bits - 1 - integer_bits)``. gemmlowp's additions wrap (its int16 ``exp`` adds one
constant saturating), its multiplications are the rounding doubling high multiply, and its
constants are int32 ones rounded to 16 bits for int16.
"""

from __future__ import annotations

import numpy as np

from .fixedpoint import c_div, doubling_high_mul, rdbp

# exp(-2^k) in Q0.31, the barrel shifter of exp_on_negative_values
_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535), (3, 720401),
           (4, 242))


def wrap(x, bits: int) -> np.ndarray:
    """The C++ sum of two ``bits``-bit values stored back: wrapped."""
    half = 1 << (bits - 1)
    return ((np.asarray(x, np.int64) + half) & ((1 << bits) - 1)) - half


def mul_pot(x, exponent: int, bits: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT: a saturating left shift, or a rounding right shift."""
    if exponent > 0:
        half = 1 << (bits - 1)
        return np.clip(np.asarray(x, np.int64) << exponent, -half, half - 1)
    return rdbp(x, -exponent) if exponent < 0 else np.asarray(x, np.int64)


def const(int32_value: int, bits: int) -> int:
    """GEMMLOWP_CHECKED_FIXEDPOINT_CONSTANT: an int32 constant, rounded to ``bits`` bits."""
    return int(rdbp(int32_value, 32 - bits))


def _mul(a, b, bits: int) -> np.ndarray:
    return doubling_high_mul(a, b, bits=bits)


def _exp_on_quarter(a: np.ndarray, bits: int) -> np.ndarray:
    """exp(a) for a in [-1/4, 0) with no integer bits: the Taylor expansion around -1/8."""
    term, third = const(1895147668, bits), const(715827883, bits)
    x = wrap(a + (1 << (bits - 4)), bits)  # a + 1/8
    x2 = _mul(x, x, bits)
    x3 = _mul(x2, x, bits)
    x4 = _mul(x2, x2, bits)
    inner = wrap(_mul(wrap(mul_pot(x4, -2, bits) + x3, bits), third, bits) + x2, bits)
    total = term + _mul(term, wrap(x + mul_pot(inner, -1, bits), bits), bits)
    return np.clip(total, -(1 << (bits - 1)), (1 << (bits - 1)) - 1) if bits == 16 else wrap(total, bits)


def exp_on_negative(a: np.ndarray, integer_bits: int, bits: int) -> np.ndarray:
    """exp(a) of non-positive raw values with ``integer_bits`` integer bits, with none."""
    frac = bits - 1 - integer_bits
    quarter = 1 << (frac - 2)
    a_mod = wrap((a & (quarter - 1)) - quarter, bits)
    result = _exp_on_quarter(mul_pot(a_mod, integer_bits, bits), bits)
    remainder = wrap(a_mod - a, bits)
    for exponent, multiplier in _BARREL:
        if integer_bits > exponent:
            hit = (remainder & (1 << (frac + exponent))) != 0
            result = np.where(hit, _mul(result, const(multiplier, bits), bits), result)
    if integer_bits > 5:
        result = np.where(a < const(-(1 << (36 - integer_bits)), bits), 0, result)
    return np.where(a == 0, (1 << (bits - 1)) - 1, result)


def _newton(a: np.ndarray, bits: int) -> np.ndarray:
    """Three Newton-Raphson steps towards 1 / (1 + a) for a in (0, 1), in two integer bits."""
    total = a + (1 << (bits - 1)) - 1
    half = c_div(total + np.where(total >= 0, 1, -1), 2)  # RoundingHalfSum(a, One)
    x = wrap(const(1515870810, bits) + _mul(half, const(-1010580540, bits), bits), bits)  # 48/17 - 32/17 d
    one = 1 << (bits - 3)
    for _ in range(3):
        x = wrap(x + mul_pot(_mul(x, wrap(one - _mul(half, x, bits), bits), bits), 2, bits), bits)
    return x


def one_over_one_plus_x(a: np.ndarray, bits: int) -> np.ndarray:
    """1 / (1 + a) for a in [0, 1), no integer bits in and out."""
    return mul_pot(_newton(a, bits), 1, bits)


def one_minus_x_over_one_plus_x(a: np.ndarray, bits: int) -> np.ndarray:
    """(1 - a) / (1 + a) for a in (0, 1), no integer bits in and out."""
    return mul_pot(wrap(_newton(a, bits) - (1 << (bits - 3)), bits), 2, bits)


def logistic(a: np.ndarray, integer_bits: int, bits: int) -> np.ndarray:
    positive = a > 0
    magnitude = np.where(positive, a, wrap(-a, bits))
    on_positive = one_over_one_plus_x(exp_on_negative(wrap(-magnitude, bits), integer_bits, bits), bits)
    top = (1 << (bits - 1)) - 1
    return np.where(a == 0, const(1 << 30, bits), np.where(positive, on_positive, wrap(top - on_positive, bits)))


def tanh(a: np.ndarray, integer_bits: int, bits: int) -> np.ndarray:
    negative = a < 0
    n = np.where(negative, a, wrap(-a, bits))
    t = one_minus_x_over_one_plus_x(exp_on_negative(n, integer_bits + 1, bits), bits)
    return np.where(a == 0, 0, np.where(negative, wrap(-t, bits), t))


def inv_sqrt_multiplier(value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetInvSqrtQuantizedMultiplierExp(value, reverse_shift=-1) of positive int32 values:
    (multiplier, shift) for MultiplyByQuantizedMultiplier giving ``x / sqrt(value)``. The value is
    normalized to [2^27, 2^29) by bit pairs, five Newton-Raphson steps run in three integer bits,
    then a multiplication by sqrt(2) / 2. Values of 0 and 1 give (2^31 - 1, 0)."""
    value = np.asarray(value, np.int64)
    small = value <= 1
    x_in = np.where(small, 2, value)
    shift = np.full(x_in.shape, 11, np.int64)
    while np.any(x_in >= 1 << 29):
        big = x_in >= 1 << 29
        x_in = np.where(big, x_in // 4, x_in)
        shift = shift + big
    leading = 32 - np.frexp(x_in.astype(np.float64))[1]  # CountLeadingZeros of a uint32
    pairs = (leading - 1) // 2 - 1
    shift = shift - pairs
    x_in = x_in << (2 * pairs)
    half_input = rdbp(x_in >> 1, 1)
    half_three = (1 << 28) + (1 << 27)
    x = np.full(x_in.shape, 1 << 28, np.int64)
    for _ in range(5):
        x3 = mul_pot(_mul(_mul(x, x, 32), x, 32), 6, 32)
        x = mul_pot(wrap(_mul(half_three, x, 32) - _mul(half_input, x3, 32), 32), 3, 32)
    x = _mul(x, 1518500250, 32)
    x = np.where(shift < 0, x << np.maximum(-shift, 0), x)
    shift = np.maximum(shift, 0)
    return np.where(small, 2**31 - 1, x), np.where(small, 0, -shift)
