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
(2^-18, relative: an output of 255 codes moves by 2^-10 of a code at most). The
result is proven with :func:`~npuforge.sim.monotone_fit.verify` before it is
kept; channels with no such ``M`` keep theirs (the simulator computes them
apart). On Lite0 (per-channel, 100 calibration images) 20,893 of 22,008 channels
match, in 16-19 s; the others mostly have large accumulators per output step
(projection layers, the classifier) or are dead. Nothing else in the integer
program changes, and the simulator then runs that much of the ``fixedpoint``
program as ONNX Runtime's own int8 kernels (:mod:`npuforge.sim.qoperator`).

A right shift left in the multiplier (TFLite's normalized form, or multipliers
below 2^-11) rounds a second time, half away from zero: an offset of opposite
sign on each side of zero that no single float32 scale reproduces, so such
channels seldom match.

The quantizer runs this last (after AdaRound and bias correction) when asked:
``--ort-multipliers`` (``QuantConfig.ort_multipliers``); by default it keeps the
nearest multipliers.
"""

from __future__ import annotations

import numpy as np
import torch

from ..sim.int_ops import requantize_fixedpoint
from ..sim.lowering_base import channel_ranges
from ..sim.monotone_fit import Formula, exact_steps, float32_nudged, verify

NUDGES = tuple(sorted(range(-64, 65), key=abs))  # float32 scales tried, in ulps from float32(m)
M_MAX = 2**31 - 1
MAX_CHANGE = 2.0**-18  # relative: an output of 255 codes moves by 2^-10 of a code at most
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
    return lower.max(axis=1), upper.min(axis=1)


def fixedpoint_rule(m: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """acc [C, J] -> the clamped fixed-point outputs with multipliers m [C], right shifts e [C]."""
    mult = torch.from_numpy(np.asarray(m, np.int64)[:, None])
    shift = torch.from_numpy(-np.asarray(e, np.int64)[:, None])

    def exact(acc: np.ndarray) -> np.ndarray:
        y = requantize_fixedpoint(torch.from_numpy(acc), mult, shift, saturate=False).numpy()
        return np.clip(y, lo[:, None], hi[:, None])

    return exact


def match_node(sim, node) -> tuple[np.ndarray, np.ndarray] | None:
    """(new multipliers, matched channels) of one Conv / Gemm, or None when no channel
    qualifies (a right shift of at most MAX_SHIFT bits, an accumulator within int32)."""
    prep = sim._prep_compute(node)
    if node.attrs.get("activation") == "LeakyRelu":
        return None
    a, b, lo, hi = channel_ranges(sim, node)
    channels = len(a)
    stored = np.asarray(prep["M"], np.int64).reshape(-1)
    shared = stored.size == 1  # per-tensor: one multiplier must serve every channel
    m_c = np.broadcast_to(stored, (channels,)).copy()
    e = np.broadcast_to(-np.asarray(prep["S"], np.int64).reshape(-1), (channels,)).copy()
    eligible = (e >= 0) & (e <= MAX_SHIFT) & (np.maximum(-a, b) < 2**31)
    if not (eligible.all() if shared else eligible.any()):
        return None
    e = np.where(eligible, e, 0)  # the others are left alone
    new, done = m_c.copy(), ~eligible
    for ulps in NUDGES:
        todo = np.flatnonzero(~done)
        ok = _try_scale(m_c[todo], e[todo], a[todo], b[todo], lo[todo], hi[todo], ulps, shared)
        if shared and not ok[0].all():
            continue
        new[todo] = np.where(ok[0], ok[1], new[todo])
        done[todo] |= ok[0]
        if done.all():
            break
    matched = done & eligible
    return (new[:1] if shared else new), matched


def _try_scale(m, e, a, b, lo, hi, ulps: int, shared: bool) -> tuple[np.ndarray, np.ndarray]:
    """(proven, multipliers) for these channels with the float32 scale ``ulps`` from float32(m)."""
    formula = Formula(float32_nudged(m * 2.0 ** (-31 - e), ulps), rnd="round")
    ort = lambda acc: formula.evaluate(acc, lo[:, None], hi[:, None])  # noqa: E731
    levels, t = exact_steps(ort, formula, a, b, lo, hi)
    valid = levels <= hi[:, None]
    lower, upper = multiplier_interval(t, levels, a, b, e, valid)
    if shared:
        lower, upper = np.full(len(m), lower.max()), np.full(len(m), upper.min())
    slack = np.floor(m * MAX_CHANGE).astype(np.int64)  # never further than this from the nearest multiplier
    lower, upper = np.maximum(lower, m - slack), np.minimum(upper, m + slack)
    pick = np.clip(m, lower, upper)
    ok = lower <= upper
    k = np.flatnonzero(ok)  # the proof, where there is something to prove
    if k.size:
        rule = fixedpoint_rule(pick[k], e[k], lo[k], hi[k])  # its steps, if proven, are ONNX Runtime's: the guess
        ok[k] = verify(rule, Formula(formula.r[k], rnd="round"), a[k], b[k], lo[k], hi[k],
                       exact_steps(rule, t[k], a[k], b[k], lo[k], hi[k]))
    return ok, pick


def match_multipliers(graph, names=None, progress=None) -> dict:
    """Rewrite, in place, the shift-0 multipliers of every quantized Conv / Gemm (those
    in ``names`` if given) to ones ONNX Runtime's QLinearConv reproduces; -> a report."""
    from ..sim.integer import IntegerSimulator

    sim = IntegerSimulator(graph, "fixedpoint")
    nodes = [n for n in graph.nodes if sim._kind(n) == "compute" and n.op in ("Conv", "Gemm")
             and (names is None or n.name in names)]
    report = {"channels": 0, "matched": 0, "max_relative_change": 0.0, "unmatched_nodes": []}
    for k, node in enumerate(nodes):
        got = match_node(sim, node)
        if progress is not None:
            progress(k + 1, len(nodes))
        if got is None:
            continue
        new, matched = got
        value = graph.values[node.quant["multiplier"]]
        old = np.asarray(value.data, np.int64)
        value.data = new.astype(np.int32).reshape(old.shape)
        change = np.abs(new - old.reshape(-1)) / np.maximum(old.reshape(-1), 1)
        report["channels"] += len(matched)
        report["matched"] += int(matched.sum())
        report["max_relative_change"] = max(report["max_relative_change"], float(change.max(initial=0)))
        if not matched.all():
            report["unmatched_nodes"].append(node.name)
    return report
