"""Fixed-point multipliers that ONNX Runtime's integer convolution reproduces exactly.

With the quantizer's folded multipliers (shift 0, :func:`~npuforge.quant.requant.requant_multiplier`)
the ``fixedpoint`` rounding of a Conv / Gemm output is ``floor((acc * M + 2^30) / 2^31)``:
``acc * M / 2^31`` rounded once, ties up. ONNX Runtime's QLinearConv computes
``rint(float32(acc) * s)`` in float32 with a float32 scale ``s``. Both are
nondecreasing step functions of the integer accumulator, so they are equal on a
channel's whole accumulator range exactly when they step at the same places
(:mod:`npuforge.sim.monotone_fit`).

For the nearest multiplier ``round(m * 2^31)`` that holds for most channels and
some ``s`` within a few ulps of ``m`` (87 % of EfficientNet-Lite0's channels),
not for all: where float32's rounding of ``acc * s`` moves one of the ~255
steps by one accumulator, no ``s`` follows the exact rule. But ``M`` itself is
free within a few parts in 2^24: every integer in that window approximates the
real multiplier ``m`` about as well as the nearest one (the rounding of ``m`` to
31 bits is itself a choice of that size). So for each channel this module takes
a float32 ``s`` near ``m``, finds ONNX Runtime's steps for it, solves for the
interval of integers ``M`` whose fixed-point rule steps at exactly the same
accumulators (one linear inequality in ``M`` per step: :func:`multiplier_interval`),
and picks the ``M`` in it nearest the original, no further than MAX_CHANGE
(2^-18, relative: an output of 255 codes moves by 2^-10 of a code at most), or,
for a channel whose outputs stay small, as far as moves none of them by more
than MAX_CODE_CHANGE (2^-10 of a code: :func:`allowed_change`). The
result is proven with :func:`~npuforge.sim.monotone_fit.verify` before it is
kept; channels with no such ``M`` keep theirs (the simulator computes them
apart). Nothing else in the integer program changes, and the simulator then runs
that much of the ``fixedpoint`` program as ONNX Runtime's own int8 kernels
(:mod:`npuforge.sim.qoperator`).

A right shift left in the multiplier (TFLite's normalized form, or multipliers
below 2^-11, which the quantizer keeps normalized for their precision) rounds a
second time, half away from zero: an offset of opposite sign on each side of zero
that no single float32 scale reproduces where a channel's outputs take both
signs (a projection's). So a per-channel multiplier with a right shift is tried
folded into a shift-0 one, ``round(M / 2^e)``, where that moves it by at most a
quarter of the channel's allowed change (2^-20: 20 bits kept; more for a nearly
dead channel, whose tiny multiplier keeps a right shift of 13 bits or more and
whose outputs reach a few codes): it then rounds once, like the others
(:func:`fold_shifts`); a channel that does not match keeps its multiplier and
shift. On Lite0 (per-channel, 100 calibration images) 21,729 of 22,008 channels
match (21,655 with the relative bound alone, 20,893 before the fold); three
convolutions keep channels apart, the classifier's the most (its accumulators
per output step are the largest). On MobileNetV2 17,168 of 18,056: five, of
which the classifier holds 867 channels.

A MatMul of two 8-bit activations is one channel more, its accumulators within plus or minus
``K max|a - zp_a| max|b - zp_b|`` (:func:`~npuforge.sim.lowering_base.matmul_ranges`), matched to
QLinearMatMul's ``rint(float32(acc) * s)`` the same way: attention's weights times V, whose
multiplier is often below 2^-11, then runs as one QLinearMatMul instead of in float.

The quantizer runs this last (after AdaRound and bias correction) when asked:
``--ort-multipliers`` (``QuantConfig.ort_multipliers``); by default it keeps the
nearest multipliers.
"""

from __future__ import annotations

import numpy as np
import torch

from ..sim.int_ops import requantize_fixedpoint
from ..sim.lowering_base import channel_ranges, matmul_ranges
from ..sim.monotone_fit import Formula, exact_steps, float32_nudged, verify

NUDGES = tuple(sorted(range(-64, 65), key=abs))  # float32 scales tried, in ulps from float32(m)
M_MAX = 2**31 - 1
MAX_CHANGE = 2.0**-18  # relative: an output of 255 codes moves by 2^-10 of a code at most
MAX_CODE_CHANGE = 2.0**-10  # absolute, in output codes: a channel whose outputs stay small may move further
MAX_SHIFT = 20  # right shifts beyond this are left alone (j 2^(31+e) must fit int64)


def _ceil_div(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return -((-p) // q)


def multiplier_interval(t: np.ndarray, levels: np.ndarray, a: np.ndarray, b: np.ndarray, e: np.ndarray,
                        valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per channel [L, U]: the multipliers M whose fixed-point rule with right shift ``e_c``
    first reaches ``levels[c, j]`` at accumulator ``t[c, j]`` (``b_c + 1``: never within
    [a_c, b_c]), for every ``valid`` level. Empty where L > U.

    With ``x M + c(x) >= j 2^(31+e)`` for "y(x) >= j" (:func:`requantize_fixedpoint`'s one-step
    form: c = 2^30 for e = 0, else 2^30 + 2^(30+e) - 2^31 [x < 0], taking ``x M < -2^30`` for
    every x < 0, as with normalized multipliers; the proof afterwards checks it), "y(x) >= j"
    is ``x M >= R(x)`` and "y(x) < j" is ``x M <= R(x) - 1``: each a half-line in M
    (direction by the sign of x; for x = 0 always or never true)."""
    big = np.int64(2**62)
    e_ = e.astype(np.int64)[:, None]
    lower = np.zeros(levels.shape, np.int64)
    upper = np.full(levels.shape, M_MAX, np.int64)

    def bound(x):  # R(x)
        extra = np.where(e_ > 0, (np.int64(1) << (30 + e_)) - np.where(x < 0, 2**31, 0), 0)
        return (levels.astype(np.int64) << (31 + e_)) - 2**30 - extra

    def at_least(x, r, use):  # x M >= r
        lo_ = np.where(x > 0, _ceil_div(r, np.where(x > 0, x, 1)), np.where((x == 0) & (r > 0), big, 0))
        hi_ = np.where(x < 0, r // np.where(x < 0, x, -1), big)
        return np.where(use, lo_, 0), np.where(use, hi_, big)

    def at_most(x, r, use):  # x M <= r
        hi_ = np.where(x > 0, r // np.where(x > 0, x, 1), big)
        lo_ = np.where(x < 0, _ceil_div(r, np.where(x < 0, x, -1)), np.where((x == 0) & (r < 0), big, 0))
        return np.where(use, lo_, 0), np.where(use, hi_, big)

    a_, b_ = a[:, None], b[:, None]
    inside = t <= b_
    before, end = t - 1, np.broadcast_to(b_, t.shape)
    for lo_, hi_ in (at_least(t, bound(t), valid & inside),                              # reaches j at t
                     at_most(before, bound(before) - 1, valid & inside & (t > a_)),      # not just before
                     at_most(end, bound(end) - 1, valid & ~inside)):                     # never
        lower, upper = np.maximum(lower, lo_), np.minimum(upper, hi_)
    return lower.max(axis=1, initial=0), upper.min(axis=1, initial=M_MAX)  # no level (a constant output): any M


def fixedpoint_rule(m: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """acc [C, J] -> the clamped fixed-point outputs with multipliers m [C], right shifts e [C]."""
    mult = torch.from_numpy(np.asarray(m, np.int64)[:, None])
    shift = torch.from_numpy(-np.asarray(e, np.int64)[:, None])

    def exact(acc: np.ndarray) -> np.ndarray:
        y = requantize_fixedpoint(torch.from_numpy(acc), mult, shift, saturate=False).numpy()
        return np.clip(y, lo[:, None], hi[:, None])

    return exact


def allowed_change(m: np.ndarray, e: np.ndarray, a: np.ndarray, b: np.ndarray, lo: np.ndarray,
                   hi: np.ndarray) -> np.ndarray:
    """Per channel, how far (relative) its multiplier may move: MAX_CHANGE, or further where the
    channel's outputs stay small, so that no output moves by more than MAX_CODE_CHANGE codes
    (its largest unclamped output: the largest |accumulator| times the real multiplier, at most
    the clamp's). A channel that reaches a few codes only (a nearly dead one, whose tiny
    multiplier keeps a right shift of 13 bits or more) thus keeps a fold and a match."""
    return np.maximum(MAX_CHANGE, MAX_CODE_CHANGE / np.maximum(largest_output(m, e, a, b, lo, hi), 2.0**-30))


def largest_output(m, e, a, b, lo, hi) -> np.ndarray:
    """Per channel, the largest |output| (in codes, before the zero point) a requantization by
    ``m 2^-(31+e)`` reaches on accumulators in [a, b] before its clamp [lo, hi] takes over."""
    real = np.asarray(m, np.float64) * 2.0 ** (-31.0 - np.asarray(e, np.float64))
    return np.minimum(np.maximum(np.abs(a), np.abs(b)) * real, np.maximum(np.abs(lo), np.abs(hi)) + 1.0)


def fold_shifts(m: np.ndarray, e: np.ndarray, allowed=MAX_CHANGE) -> tuple[np.ndarray, np.ndarray]:
    """(multipliers, right shifts) with each right shift folded into its multiplier, ``round(M / 2^e)``
    with shift 0, where that moves the multiplier by at most a quarter of ``allowed`` (relative, per
    channel: 2^-20 for MAX_CHANGE, where M / 2^e keeps 20 bits or more); the others as given.
    Rounding twice, the second time half away from zero on both sides of zero, has no float32
    scale that follows it on outputs of both signs (a projection's); folded, the rule rounds once."""
    half = np.where(e > 0, np.left_shift(np.int64(1), np.maximum(e - 1, 0)), 0)
    folded = (m + half) >> np.maximum(e, 0)
    ok = (e > 0) & (folded > 0) & (np.abs(folded * 2.0 ** e - m) <= m * np.asarray(allowed) / 4)
    return np.where(ok, folded, m), np.where(ok, 0, e)


def match_node(sim, node) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(new multipliers, new right shifts, matched channels) of one Conv / Gemm / MatMul, or None when no
    channel qualifies (a right shift of at most MAX_SHIFT bits, an accumulator within int32). A
    per-channel multiplier that keeps a right shift is tried folded to shift 0 (:func:`fold_shifts`)
    and keeps its fold where it matches; unmatched channels keep their multiplier and shift."""
    if node.attrs.get("activation") == "LeakyRelu":
        return None
    ranges = _ranges(sim, node)
    if ranges is None:
        return None
    a, b, lo, hi = ranges
    channels = len(a)
    stored = sim._int(node, "multiplier").astype(np.int64).reshape(-1)
    shared = stored.size == 1 and channels > 1  # per-tensor: one multiplier must serve every channel
    m_old = np.broadcast_to(stored, (channels,)).copy()
    e_old = np.broadcast_to(-sim._int(node, "shift").astype(np.int64).reshape(-1), (channels,)).copy()
    allowed = allowed_change(m_old, e_old, a, b, lo, hi)
    m_c, e = (m_old, e_old) if shared else fold_shifts(m_old, e_old, allowed)
    eligible = (e >= 0) & (e <= MAX_SHIFT) & (np.maximum(-a, b) < 2**31)
    if not (eligible.all() if shared else eligible.any()):
        return None
    target = m_old * 2.0 ** (e - e_old)  # the stored multipliers, in units of the (folded) ones
    e = np.where(eligible, e, 0)  # the others are left alone
    new, done = m_c.copy(), ~eligible
    for ulps in NUDGES:
        todo = np.flatnonzero(~done)
        ok = _try_scale(m_c[todo], e[todo], a[todo], b[todo], lo[todo], hi[todo], ulps, shared, target[todo],
                        allowed[todo] if not shared else MAX_CHANGE)
        if shared and not ok[0].all():
            continue
        new[todo] = np.where(ok[0], ok[1], new[todo])
        done[todo] |= ok[0]
        if done.all():
            break
    matched = done & eligible
    if shared:
        return new[:1], None, matched
    return np.where(matched, new, m_old), np.where(matched, e, e_old), matched


def _ranges(sim, node) -> tuple | None:
    """A Conv / Gemm's channel ranges, or a MatMul of two activations' one range."""
    return matmul_ranges(sim, node) if sim._kind(node) == "matmul" else channel_ranges(sim, node)


def _try_scale(m, e, a, b, lo, hi, ulps: int, shared: bool, target=None,
               allowed=MAX_CHANGE) -> tuple[np.ndarray, np.ndarray]:
    """(proven, multipliers) for these channels with the float32 scale ``ulps`` from float32(m);
    ``target``: the stored multipliers in units of these (a folded shift's), never moved further
    than ``allowed`` (relative, per channel) from (default: m)."""
    formula = Formula(float32_nudged(m * 2.0 ** (-31 - e), ulps), rnd="round")
    ort = lambda acc: formula.evaluate(acc, lo[:, None], hi[:, None])  # noqa: E731
    levels, t = exact_steps(ort, formula, a, b, lo, hi)
    valid = levels <= hi[:, None]
    lower, upper = multiplier_interval(t, levels, a, b, e, valid)
    if shared:
        lower, upper = np.full(len(m), lower.max()), np.full(len(m), upper.min())
    target = m.astype(np.float64) if target is None else target  # never further than MAX_CHANGE from it
    lower = np.maximum(lower, np.ceil(target * (1 - allowed)).astype(np.int64))
    upper = np.minimum(upper, np.floor(target * (1 + allowed)).astype(np.int64))
    pick = np.clip(m, lower, upper)
    ok = lower <= upper
    k = np.flatnonzero(ok)  # the proof, where there is something to prove
    if k.size:
        rule = fixedpoint_rule(pick[k], e[k], lo[k], hi[k])  # its steps, if proven, are ONNX Runtime's: the guess
        ok[k] = verify(rule, Formula(formula.r[k], rnd="round"), a[k], b[k], lo[k], hi[k],
                       exact_steps(rule, t[k], a[k], b[k], lo[k], hi[k]))
    return ok, pick


def _eight_bit(graph, node) -> bool:
    """Whether ``node`` reads and writes 8-bit activations: ONNX Runtime's QLinearConv has no
    int16 form, and an int16 output has 256 times the steps to prove."""
    operands = node.inputs[:2] if node.op == "MatMul" else node.inputs[:1]  # a MatMul's B: weights or activation
    return all(graph.values[n].quant.dtype in ("uint8", "int8") for n in (*operands, node.outputs[0])
               if graph.values[n].quant is not None)


def match_multipliers(graph, names=None, progress=None) -> dict:
    """Rewrite, in place, the shift-0 multipliers of every quantized Conv / Gemm / MatMul, of two
    activations too (those in ``names`` if given), to ones ONNX Runtime's QLinearConv / QLinearMatMul
    reproduces; -> a report."""
    from ..sim.integer import IntegerSimulator

    sim = IntegerSimulator(graph, "fixedpoint")
    nodes = [n for n in graph.nodes if (sim._kind(n) == "compute" and n.op in ("Conv", "Gemm", "MatMul") or
                                        sim._kind(n) == "matmul") and (names is None or n.name in names)
             and _eight_bit(graph, n)]
    report = {"channels": 0, "matched": 0, "max_relative_change": 0.0, "max_code_change": 0.0, "unmatched_nodes": []}
    for k, node in enumerate(nodes):
        got = match_node(sim, node)
        if progress is not None:
            progress(k + 1, len(nodes))
        if got is None:
            continue
        new, shifts, matched = got
        value = graph.values[node.quant["multiplier"]]
        old = np.asarray(value.data, np.int64)
        shift = graph.values[node.quant["shift"]]
        old_shift = np.broadcast_to(np.asarray(shift.data, np.int64).reshape(-1), new.shape)
        value.data = new.astype(np.int32).reshape(old.shape)
        if shifts is not None:
            shift.data = (-shifts).astype(np.int32).reshape(old.shape)  # per channel, as the multipliers
        new_shift = old_shift if shifts is None else -shifts
        change = np.abs(new * 2.0 ** new_shift.astype(np.float64) - old.reshape(-1) * 2.0 ** old_shift) / \
            np.maximum(old.reshape(-1) * 2.0 ** old_shift, 2.0**-60)
        report["channels"] += len(matched)
        report["matched"] += int(matched.sum())
        report["max_relative_change"] = max(report["max_relative_change"], float(change.max(initial=0)))
        a, b, lo, hi = _ranges(sim, node)
        moved = change * largest_output(old.reshape(-1), -old_shift, a, b, lo, hi)
        report["max_code_change"] = max(report["max_code_change"], float(moved.max(initial=0)))
        if not matched.all():
            report["unmatched_nodes"].append(node.name)
    return report
