"""Fixed-point requantization multipliers, as gemmlowp / TFLite define them.

A real multiplier m > 0 is stored as an int32 ``multiplier`` (a Q0.31 number)
and an int32 ``shift``:

    m ~= multiplier * 2^(shift - 31)

``shift`` > 0 is a left shift (m >= 1), < 0 a right shift. TFLite normalizes the
multiplier to [2^30, 2^31) (:func:`quantize_multiplier`, relative error at most
2^-31); the quantizer by default folds short right shifts into it instead
(:func:`requant_multiplier`), so the fixed-point requantization rounds once.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpuforgeError


def quantize_multiplier(m) -> tuple[np.ndarray, np.ndarray]:
    m = np.asarray(m, np.float64)
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        # (a bias of -inf, a scale of 0 or inf: the quantizer's checks should have named the node)
        bad = m[(m < 0) | ~np.isfinite(m)].reshape(-1)[0]
        raise NpuforgeError(f"a requantization multiplier is {bad}, not a finite non-negative number: a weight, bias, "
                            f"scale or attribute of the model is negative, NaN or infinite; fix it and quantize again")
    frac, exp = np.frexp(m)  # m = frac * 2^exp, frac in [0.5, 1)
    q = np.floor(frac * 2.0**31 + 0.5).astype(np.int64)  # half away from zero, as TFLite's TfLiteRound
    carry = q == 2**31  # frac rounded up to 1.0
    q = np.where(carry, q // 2, q)
    exp = np.where(carry, exp + 1, exp)
    zero = (m == 0) | (exp < -31)  # TFLite flushes multipliers below 2^-32 to zero
    q = np.where(zero, 0, q)
    exp = np.where(zero, 0, exp)
    return q.astype(np.int32), exp.astype(np.int32)


FOLD_MAX_BITS = 10  # right shifts folded into the multiplier (see requant_multiplier)


def requant_multiplier(m, tflite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The stored (multiplier, shift) of a requantization by m.

    ``tflite=True``: :func:`quantize_multiplier`, normalized as TFLite stores it.
    Otherwise a right shift e = -shift of 1 to FOLD_MAX_BITS bits is folded into
    the multiplier: ``multiplier = round(m * 2^31)``, shift 0. gemmlowp's
    ``MultiplyByQuantizedMultiplier`` takes any multiplier in [0, 2^31), and with
    shift 0 it rounds once. With the right shift it rounds twice, and the first
    rounding moves a value just below a half up across it: about 2^-(e+1) of all
    outputs, e.g. 0.8 % for a typical convolution's e = 6, come out one code too
    high in magnitude (measured on EfficientNet-Lite0: 0.45 % of the stem's outputs
    and 1.9 % after the first depthwise layer differ from one rounding). Folding
    costs multiplier precision instead: at least 21 bits are left (relative error
    <= 2^-21), which moves an output of up to 255 codes by at most 2^-13 of a code;
    beyond 10 bits that cost would exceed the double rounding's, so smaller
    multipliers stay normalized."""
    mult, shift = quantize_multiplier(m)
    if tflite:
        return mult, shift
    m = np.asarray(m, np.float64)
    fold = (shift < 0) & (shift >= -FOLD_MAX_BITS)
    folded = np.rint(m * 2.0**31)  # m < 2^shift <= 1/2, so below 2^30
    return (np.where(fold, folded, mult).astype(np.int32), np.where(fold, 0, shift).astype(np.int32))


TFLITE_ADD_LEFT_SHIFT = 20  # TFLite's int8 ADD / SUB: operands shifted left by 20 bits before rescaling


def tflite_add_multipliers(s0, s1, s_out) -> dict:
    """TFLite's three real multipliers of an int8 ADD / SUB (its ``add.cc`` Prepare): each
    operand is rescaled to ``s_k / (2 max(s0, s1))`` (at most 1/2, so two shifted operands
    add without overflow), their sum by ``2 max(s0, s1) / (2^20 s_out)``. In float64 from
    the float32 scales, as TFLite computes them; keys are the quantizer's role suffixes."""
    s0, s1, s_out = (np.float64(np.float32(s)) for s in (s0, s1, s_out))
    twice_max = 2.0 * max(s0, s1)
    return {"0": s0 / twice_max, "1": s1 / twice_max, "out": twice_max / (2.0**TFLITE_ADD_LEFT_SHIFT * s_out)}


def tflite_mul_multiplier(s0, s1, s_out) -> np.float64:
    """The real multiplier of TFLite's int8 MUL (its ``mul.cc`` Prepare): ``s0 * s1 / s_out`` computed in
    float32, as the C++ expression on the tensors' float scales is, then widened to double. It can
    differ from the float64 quotient in its last bits, and then the quantized multiplier by a few
    units: LiteRT's reference MUL gave 37 where the float64 multiplier gives 38 (a product of
    8480 at a multiplier of 1215430181 against LiteRT's 1215430144, shift -7; Swin-T's layer norm)."""
    s0, s1, s_out = (np.float32(s) for s in (s0, s1, s_out))
    return np.float64(np.float32(s0 * s1) / s_out)


def tflite_product_multiplier(s_in, s_w, s_out) -> np.float64:
    """The real multiplier of TFLite's int8 BATCH_MATMUL (kernel_util's GetQuantizedConvolutionMultipler):
    the product of the two input scales in float32, widened to double, then divided by the output
    scale in double. CONV_2D and FULLY_CONNECTED multiply in double, FULLY_CONNECTED with one weight
    scale too (LiteRT 2.3, tests/test_tflite_export_ops.py). LiteRT's reference
    BATCH_MATMUL gave 55 where the float64 multiplier gives 54: an accumulator of 39871 at a multiplier
    of 1751095089 against LiteRT's 1751095165, shift -9, whose doubling high multiply lands on 32511.5
    (GCViT's attention, scales 0.0033882095, 0.021494735 and 0.045729078)."""
    s_in, s_w, s_out = (np.float32(s) for s in (s_in, s_w, s_out))
    return np.float64(s_in * s_w) / np.float64(s_out)


def tflite_mean_multiplier(real, count: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's integer MEAN over ``count`` elements: the stored multiplier of ``real``
    (``s_x / s_y``) with 1/count folded in by an integer division, after a left shift of
    floor(log2(count)) bits (at most 32 and at most 31 + shift) kept for precision."""
    mult, shift = quantize_multiplier(np.atleast_1d(np.asarray(real, np.float64)))
    bits = np.minimum(np.minimum(int(count).bit_length() - 1, 32), 31 + shift.astype(np.int64))
    folded = (mult.astype(np.int64) << bits) // int(count)
    return folded.astype(np.int32), (shift - bits).astype(np.int32)


EXTRA_BITS = 20  # fractional bits kept by Add/Sub and pooling before their final rounding


def extra_bits(max_abs: int, shifts) -> int:
    """Fractional bits L such that max_abs * 2^L * 2^max(shift, 0) < 2^30 (at most 20): what
    an integer Add / Sub or pooling keeps before its final rounding, a pure function of the
    stored shifts and the operands' zero points and dtypes."""
    left = int(max(0, int(np.max(shifts)))) if np.size(shifts) else 0
    need = int(max_abs).bit_length() + left
    return max(0, min(EXTRA_BITS, 30 - need))


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
