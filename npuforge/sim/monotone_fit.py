"""Proving a few float operations equal to an integer requantization.

A requantization ``y = clamp(R(acc), lo, hi)`` (fixed point, single rounding or
the ONNX float rule) is a nondecreasing step function of the integer
accumulator. So is a short float formula such as ``floor(float64(acc) * r + b)``:
float conversion, multiplication by r > 0, addition, floor and round-half-even
are each monotone (and so is the symmetric ``sign(x) * floor(|x| * r + b)`` for
0 <= b < 1, which is 0 around x = 0). Two nondecreasing integer-valued functions clamped to the
same ``[lo, hi]`` are equal on an integer interval ``[A, B]`` exactly when they
step up at the same places: for every level ``j`` in ``(lo, hi]`` the first
``acc`` with ``y(acc) >= j`` (the threshold ``T_j``, found by binary search on
the exact function) satisfies ``f(T_j) >= j`` and ``f(T_j - 1) < j`` (or
``f(B) < j`` when ``y`` never reaches j). That is at most ``2 * (hi - lo)``
evaluations per channel, however wide ``[A, B]`` is, and it is a proof, not a
sample: :func:`fit` returns a formula only after this check passes for every
channel.

The formulas are evaluated here in NumPy float32 / float64 (each operation
correctly rounded, as IEEE requires and as ONNX Runtime's elementwise kernels,
one node per operation, compute them) and emitted as ONNX nodes by
:mod:`npuforge.sim.lowered`; the tests run both and compare them bit for bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

# Output steps a proof walks: int8 / uint8 outputs have at most 255; an int16 output's reachable
# range is proven when it has at most MAX_LEVELS steps, or a few more on few channels (MAX_CELLS
# channel x step pairs: each [C, J] int64 array of the search then stays within 32 MB)
MAX_LEVELS = 4096
MAX_CELLS = 1 << 22


@dataclass
class Formula:
    """``y = clamp(rnd(dtype(x) * r + b), lo, hi)`` with ``x = acc + pre`` (``pre`` an
    integer offset added exactly, in float64; optional), ``rnd`` "floor" or "round"
    (half to even), ``b`` optional. ``symmetric``: ``y = sign(x) * rnd(|x| * r + b)``,
    for rules that round half away from zero. r, b, pre: arrays [C], one entry per
    channel."""

    r: np.ndarray
    b: np.ndarray | None = None
    rnd: str = "floor"
    dtype: type = np.float32  # the float type the multiply and add run in
    pre: np.ndarray | None = None
    symmetric: bool = False
    acc_dtype: type = np.float32  # what holds the accumulator (float64 for sums beyond 2^24)

    def evaluate(self, acc: np.ndarray, lo, hi) -> np.ndarray:
        """acc: int64 [C, J] (row c for channel c) -> int64 [C, J], as IEEE arithmetic
        gives it (acc itself is exact in ``acc_dtype``: the caller proved it)."""
        x = acc.astype(self.acc_dtype)
        if self.pre is not None:
            x = x.astype(np.float64) + self.pre[:, None].astype(np.float64)
            x = x.astype(self.dtype)
        sign = np.sign(x) if self.symmetric else None
        v = (np.abs(x) if self.symmetric else x).astype(self.dtype) * self.r[:, None]
        t = v + self.b[:, None] if self.b is not None else v
        t = np.rint(t) if self.rnd == "round" else np.floor(t)
        if sign is not None:
            t = t.astype(np.float32) * sign.astype(np.float32)
        return np.minimum(np.maximum(t, lo), hi).astype(np.int64)  # (np.clip: the same, several times slower)

    def steps(self, levels: np.ndarray) -> np.ndarray:
        """Where, in real arithmetic, the formula first reaches each level: a guess of its thresholds."""
        r = self.r[:, None].astype(np.float64)
        b = np.zeros_like(r) if self.b is None else self.b[:, None].astype(np.float64)
        if self.rnd == "round":
            b = b + 0.5
        with np.errstate(divide="ignore", invalid="ignore"):  # r = 0 (a dead channel): no step, a guess at the end
            x = np.ceil((levels - b) / r)
            if self.symmetric:  # below zero: the first x with |x| r + b < 1 - j
                x = np.where(levels <= 0, np.floor((levels - 1 + b) / r) + 1, x)
        if self.pre is not None:
            x -= self.pre[:, None]
        return np.clip(np.nan_to_num(x, nan=2.0**62), -2.0**62, 2.0**62).astype(np.int64)

    def rows(self, k: np.ndarray) -> "Formula":
        """This formula on the channels ``k`` alone."""
        return dataclasses.replace(self, **{f: None if getattr(self, f) is None else getattr(self, f)[k]
                                            for f in ("r", "b", "pre")})

    def take(self, other: "Formula", mask: np.ndarray) -> "Formula":
        """This formula with the channels in ``mask`` taken from ``other`` (same structure)."""
        def pick(x, y):
            return None if x is None else np.where(mask, y, x).astype(x.dtype)

        return dataclasses.replace(self, r=pick(self.r, other.r), b=pick(self.b, other.b),
                                   pre=pick(self.pre, other.pre))


def float32_nudged(m: np.ndarray, ulps: int) -> np.ndarray:
    """float32(m) moved ``ulps`` float32 steps up (or down)."""
    s = np.asarray(m, np.float32).copy()
    for _ in range(abs(ulps)):
        s = np.nextafter(s, np.float32(np.inf if ulps > 0 else 0), dtype=np.float32)
    return s


def thresholds(exact, a: np.ndarray, b: np.ndarray, levels: np.ndarray, guess: np.ndarray) -> np.ndarray:
    """T[c, j]: the first acc in [a_c, b_c] with exact(acc)[c] >= levels[c, j] (b_c + 1 if none).

    ``exact(acc)`` maps an int64 array [C, J] (row c for channel c) to the clamped
    outputs. ``guess`` (say, where a formula steps up) is checked first: where
    ``exact(g) >= j > exact(g - 1)`` it is the threshold; elsewhere a binary search
    over [a, b] finds it."""
    a_, b_ = np.broadcast_to(a[:, None], levels.shape), np.broadcast_to(b[:, None], levels.shape)
    g = np.clip(guess, a_, b_ + 1)
    at_g = exact(np.minimum(g, b_)) >= levels
    below = exact(np.maximum(g - 1, a_)) >= levels
    right = (np.where(g <= b_, at_g, True)) & np.where(g > a_, ~below, True)
    if right.all():
        return g
    # the wrong guesses are few (a channel's float formula off at a level or two): search them alone,
    # packed to the left of narrower [C, J'] arrays (exact reads row c as channel c)
    width = int((~right).sum(axis=1).max())
    cols = np.argsort(right, axis=1, kind="stable")[:, :width]
    pick = lambda v: np.take_along_axis(np.broadcast_to(v, right.shape), cols, axis=1)  # noqa: E731
    todo, levels_, g_ = ~pick(right), pick(levels), pick(g)
    a_, b_ = a_[:, :width], b_[:, :width]
    # in a window around the guess where it brackets the threshold, else over [a, b]
    lo = np.where(todo, np.maximum(g_ - 64, a_), g_)
    hi = np.where(todo, np.minimum(g_ + 64, b_ + 1), g_)
    fine = (lo == a_) | (exact(np.maximum(lo - 1, a_)) < levels_)
    fine &= (hi > b_) | (exact(np.minimum(hi, b_)) >= levels_)
    lo, hi = np.where(fine | ~todo, lo, a_), np.where(fine | ~todo, hi, b_ + 1)
    while True:
        open_ = lo < hi
        if not open_.any():
            break
        mid = np.minimum((lo + hi) // 2, b_)  # never evaluate outside [a, b]
        ge = exact(mid) >= levels_
        hi = np.where(open_ & ge, mid, hi)
        lo = np.where(open_ & ~ge, mid + 1, lo)
    out = g.copy()
    np.put_along_axis(out, cols, np.where(todo, lo, g_), axis=1)
    return out


def exact_steps(exact, guide, a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """(levels [C, J], T [C, J]): every level in (lo_c, hi_c] and the first acc in [a_c, b_c]
    where ``exact`` reaches it (:func:`thresholds`). ``guide`` makes the first guess: a
    Formula (where it steps up) or the thresholds [C, J] of a function expected to equal
    ``exact``. T belongs to ``exact`` alone, so one search serves every candidate formula."""
    steps = int(np.max(hi - lo, initial=0))
    levels = lo[:, None] + 1 + np.arange(steps)[None, :]  # [C, J]; levels above hi_c are never reached
    guess = guide.steps(levels) if isinstance(guide, Formula) else guide
    guess = np.where(levels > hi[:, None], b[:, None] + 1, guess)  # above hi_c: never
    return levels, thresholds(exact, a, b, levels, guess)


def verify(exact, formula: Formula, a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray,
           steps: tuple | None = None, exact_ends: np.ndarray | None = None) -> np.ndarray:
    """Per channel: does ``formula`` equal ``exact`` on every integer of [a_c, b_c]?

    a, b, lo, hi: int64 arrays [C] (lo, hi: the clamp range of the outputs); ``steps``:
    :func:`exact_steps` of the same (exact, a, b, lo, hi), when the caller has it;
    ``exact_ends``: ``exact`` at [a, b] ([C, 2]), when the caller has it (then ``exact`` is
    not called: the arrays may be a subset of its channels)."""
    levels, t = steps if steps is not None else exact_steps(exact, formula, a, b, lo, hi)
    lo_, hi_ = lo[:, None], hi[:, None]
    at = formula.evaluate(np.minimum(t, b[:, None]), lo_, hi_)
    before = formula.evaluate(np.maximum(t - 1, a[:, None]), lo_, hi_)
    inside = t <= b[:, None]
    ok = np.where(inside, at >= levels, at < levels)  # threshold outside: f(b) < j too
    ok &= np.where(inside & (t > a[:, None]), before < levels, True)
    ends = np.stack([a, b], axis=1)  # and the lowest value (no level below it to test)
    ok_ends = (formula.evaluate(ends, lo_, hi_) == (exact(ends) if exact_ends is None else exact_ends)).all(axis=1)
    return ok.all(axis=1) & ok_ends


def fit_channels(exact, candidates, a, b, lo, hi) -> tuple[Formula | None, np.ndarray]:
    """(formula, proven): for each channel the first of ``candidates`` (same structure,
    cheapest or most likely first) proven equal to ``exact`` on [a_c, b_c]; ``proven``
    [C] says where one was (elsewhere the formula holds the first candidate's
    values). (None, all False) when the outputs reachable from [a_c, b_c] have more steps
    than MAX_LEVELS and MAX_CELLS allow."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    lo = np.broadcast_to(np.asarray(lo, np.int64), a.shape).copy()
    hi = np.broadcast_to(np.asarray(hi, np.int64), a.shape).copy()
    todo = np.ones(a.shape, bool)
    # exact is nondecreasing: over [a, b] its outputs lie in [exact(a), exact(b)], so only the steps
    # in there are searched; verify still clamps to [lo, hi] and checks both ends, which covers the rest
    ends = exact(np.stack([a, b], axis=1))
    reach_lo, reach_hi = np.maximum(lo, ends[:, 0]), np.minimum(hi, ends[:, 1])
    levels = int(np.max(reach_hi - reach_lo, initial=0))
    if levels > MAX_LEVELS and levels * len(a) > MAX_CELLS:
        return None, ~todo
    chosen, steps = None, exact_steps(exact, candidates[0], a, b, reach_lo, reach_hi) if candidates else None
    for formula in candidates:
        k = np.flatnonzero(todo)  # later candidates are checked on the channels still unproven only
        ok = np.zeros(a.shape, bool)
        ok[k] = verify(None, formula.rows(k), a[k], b[k], lo[k], hi[k], (steps[0][k], steps[1][k]), ends[k])
        chosen = formula if chosen is None else chosen.take(formula, ok)
        todo &= ~ok
        if not todo.any():
            break
    return chosen, ~todo


def fit(exact, candidates, a, b, lo, hi) -> Formula | None:
    """A formula proven equal to ``exact`` on every channel's [a_c, b_c]
    (:func:`fit_channels`); None when some channel has none (or its reachable outputs
    have too many steps: left to the plain simulator)."""
    formula, proven = fit_channels(exact, candidates, a, b, lo, hi)
    return formula if proven.all() else None
