"""Observers: streaming range statistics of one tensor over calibration batches.

Memory is bounded: min/max scalars, or one fixed-size histogram per tensor.
The histogram spans a symmetric range [-R, R], R a power of two, that doubles
(merging bin pairs exactly) when a batch exceeds it, so nothing is ever kept
but the counts. Every observer ``merge``s another's statistics exactly: the
shards of a calibration run in several processes (``torchrun``) give the same
statistics as one process that saw their batches in rank order.

Methods (activation ranges):
  minmax      overall min and max
  mean        mean over batches of each batch's min and max
  percentile  the given percentile of each tail (default 99.99)
  kl          TensorRT-style entropy calibration: the clipping threshold whose
              quantized distribution has the least KL divergence from the data
  mse         the clipping range with the least expected squared quantization error
"""

from __future__ import annotations

import math

import numpy as np
import torch

METHODS = ("minmax", "mean", "percentile", "kl", "mse")


def batch_range(x: torch.Tensor) -> tuple[float, float]:
    """min and max of a batch; NaN anywhere makes them NaN, so they double as the finiteness check."""
    lo, hi = torch.aminmax(x.detach().reshape(-1))
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise FloatingPointError("NaN or Inf")
    return lo, hi


class MinMaxObserver:
    def __init__(self):
        self.lo, self.hi = np.inf, -np.inf

    def update(self, x: torch.Tensor) -> None:
        lo, hi = batch_range(x)
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)

    def range(self, levels: int) -> tuple[float, float]:
        return self.lo, self.hi

    def merge(self, other: "MinMaxObserver") -> None:
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)


class MeanObserver:
    """Each batch's min and max, kept (two floats a batch) so that the means add them in
    batch order however the batches were split over processes."""

    def __init__(self):
        self.los, self.his = [], []

    def update(self, x: torch.Tensor) -> None:
        lo, hi = batch_range(x)
        self.los.append(lo)
        self.his.append(hi)

    def range(self, levels: int) -> tuple[float, float]:
        return sum(self.los) / len(self.los), sum(self.his) / len(self.his)

    def merge(self, other: "MeanObserver") -> None:
        """``other`` saw the batches after this one's."""
        self.los += other.los
        self.his += other.his


HISTOGRAM_SAMPLE = 1 << 20
MIN_BOUND = 2.0 ** -30  # the histogram's range when every value seen is 0


def _sample(x: torch.Tensor) -> torch.Tensor:
    """At most about HISTOGRAM_SAMPLE elements of a flat tensor for the histogram: a
    deterministic 1-in-k stride, k coprime with 2, 3, 5 and 7 so that no channel,
    row or column is favoured. (Min and max always come from every element.)"""
    k = -(-x.numel() // HISTOGRAM_SAMPLE)
    if k <= 1:
        return x
    while math.gcd(k, 210) != 1:
        k += 1
    return x[::k]


class HistogramObserver:
    def __init__(self, method: str, bins: int = 4096, percentile: float = 99.99):
        if bins < 8 or bins & (bins - 1):
            raise ValueError("bins must be a power of two >= 8")
        self.method, self.bins, self.percentile = method, bins, percentile
        self.hist = np.zeros(bins, np.float64)
        self.bound = 0.0  # R, a power of two (0 before any data): the histogram spans [-R, R]
        self.lo, self.hi = np.inf, -np.inf

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1).float()
        lo, hi = batch_range(x)
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self._cover(max(-lo, hi, MIN_BOUND))
        # bin k holds [-R + k w, -R + (k + 1) w), w = 2R / bins; x * (bins / 2R) is exact (a power of
        # two in float64), so a value's bin never depends on rounding: binned at R and merged by
        # _grow, or binned at 2R directly, it lands in the same bin
        scaled = torch.floor(_sample(x).double() * (self.bins / (2 * self.bound))).long() + self.bins // 2
        self.hist += torch.bincount(scaled.clamp_(0, self.bins - 1), minlength=self.bins).double().numpy()

    def _cover(self, peak: float) -> None:
        """Grow the range to the least power of two > ``peak`` (no value on the top edge, whose
        bin would change as the range grows)."""
        bound = 2.0 ** math.frexp(peak)[1]  # peak = mantissa * 2^exponent, mantissa in [0.5, 1)
        if self.bound == 0.0:
            self.bound = bound
        elif bound > self.bound:
            self._grow(round(math.log2(bound / self.bound)))

    def _grow(self, doublings: int) -> None:
        """Widen the range by 2**doublings: bin k (offset f = k - bins/2 from the centre) moves to
        bins/2 + floor(f / 2**doublings), exactly where its values fall at the new range."""
        offsets = np.arange(self.bins) - self.bins // 2
        moved = np.floor_divide(offsets, 2 ** min(doublings, 62)) + self.bins // 2
        self.hist = np.bincount(moved, weights=self.hist, minlength=self.bins)
        self.bound *= 2.0 ** doublings

    def merge(self, other: "HistogramObserver") -> None:
        if other.bound == 0.0:
            return
        if self.bound == 0.0:
            self.bound, self.hist = other.bound, np.zeros(self.bins)
        other_hist = other.hist
        if other.bound < self.bound:
            moved = HistogramObserver(self.method, self.bins, self.percentile)
            moved.bound, moved.hist = other.bound, other.hist.copy()
            moved._grow(round(math.log2(self.bound / other.bound)))
            other_hist = moved.hist
        elif other.bound > self.bound:
            self._grow(round(math.log2(other.bound / self.bound)))
        self.hist = self.hist + other_hist
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)

    # -- range selection ----------------------------------------------------------
    def range(self, levels: int) -> tuple[float, float]:
        """Clipping range; ``levels`` is the number of quantization steps over it."""
        if self.hist.sum() == 0:
            return 0.0, 0.0
        if self.method == "percentile":
            return self._percentile()
        if self.method == "kl":
            return self._kl(levels)
        return self._mse(levels)

    def _edges(self) -> np.ndarray:
        return np.linspace(-self.bound, self.bound, self.bins + 1)

    def _percentile(self) -> tuple[float, float]:
        cdf = np.cumsum(self.hist) / self.hist.sum()
        tail = (100.0 - self.percentile) / 100.0
        edges = self._edges()
        lo = edges[np.searchsorted(cdf, tail, side="left")]
        hi = edges[min(np.searchsorted(cdf, 1.0 - tail, side="left") + 1, self.bins)]
        return max(lo, self.lo), min(hi, self.hi)

    def _abs_hist(self) -> np.ndarray:
        half = self.bins // 2
        return self.hist[half:] + self.hist[:half][::-1]

    def _kl(self, levels: int) -> tuple[float, float]:
        """TensorRT's entropy calibration on the |x| histogram (vectorized over candidates)."""
        # TensorRT's choice: 128 quantized bins over [0, T] whatever the type (the
        # divergence needs many histogram bins per quantized bin to mean anything)
        q_levels = 128
        hist = self._abs_hist()
        hist[0] = hist[1]  # flatten the spike of exact zeros (ReLU), as NVIDIA's pytorch-quantization does
        n = hist.size

        def divergence(t: int) -> float:
            sliced = hist[:t]
            p = sliced.copy()
            p[-1] += hist[t:].sum()  # the reference keeps the clipped mass in its last bin
            nonzero = p > 0
            if not nonzero.any() or not sliced.any():  # (all the mass beyond t: no candidate to compare)
                return np.inf
            # the candidate: t bins merged into q_levels groups (without the clipped
            # mass), each group's mass spread evenly over its non-empty bins
            group = (np.arange(t) * q_levels) // t
            mass = np.bincount(group, weights=sliced, minlength=q_levels)
            count = np.bincount(group, weights=nonzero.astype(np.float64), minlength=q_levels)
            q = np.where(nonzero, mass[group] / np.maximum(count[group], 1), 0.0)
            return _kl_divergence(_smooth(p), _smooth(q))

        # coarse to fine: 64 thresholds over the whole range, then every bin near the best
        coarse = max(1, (n - q_levels) // 64)
        best_t = min(range(q_levels, n + 1, coarse), key=divergence)
        fine = range(max(q_levels, best_t - coarse), min(n, best_t + coarse) + 1, max(1, coarse // 16))
        best_t = min(fine, key=divergence)
        threshold = best_t * self.bound / n
        return max(self.lo, -threshold), min(self.hi, threshold)

    def _mse(self, levels: int) -> tuple[float, float]:
        """Shrink [lo, hi] by a common factor; keep the factor whose quantization
        of the histogram (bin centres, weighted by counts) has the least squared error."""
        edges = self._edges()
        centres = (edges[:-1] + edges[1:]) / 2
        keep = self.hist > 0
        x, w = centres[keep], self.hist[keep]
        lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
        factors = np.linspace(0.2, 1.0, 81)
        los, his = lo * factors, hi * factors
        scale = np.maximum((his - los) / levels, 1e-12)[:, None]
        zero = np.rint(-los[:, None] / scale)
        q = np.clip(np.rint(x[None, :] / scale) + zero, 0, levels)
        err = (((q - zero) * scale - x[None, :]) ** 2 * w[None, :]).sum(axis=1)
        best = int(np.argmin(err))
        return float(los[best]), float(his[best])


def _smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Move a little mass onto empty bins so the divergence stays finite (as MXNet and TensorRT do)."""
    zeros = p == 0
    n_zero, n_nonzero = int(zeros.sum()), int((~zeros).sum())
    if n_zero == 0 or n_nonzero == 0:
        return p
    return p + eps * zeros - (eps * n_zero / n_nonzero) * (~zeros)


def _kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    p, q = p / p.sum(), q / q.sum()
    keep = p > 0
    return float(np.sum(p[keep] * np.log(p[keep] / np.maximum(q[keep], 1e-30))))


def make_observer(method: str, bins: int = 4096, percentile: float = 99.99):
    if method == "minmax":
        return MinMaxObserver()
    if method == "mean":
        return MeanObserver()
    return HistogramObserver(method, bins, percentile)
