"""Error metrics of an approximation against a reference, streamed over batches,
and per-output-channel weight statistics.

    SQNR (dB)   10 log10( sum x^2 / sum (x - y)^2 )        x: float reference, y: quantized
    rel. MSE    sum (x - y)^2 / sum (x - mean x)^2          (error power over the reference's variance)
    cosine      mean over samples of <x, y> / (|x| |y|)     (one sample = one image of the batch)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..quant.params import weight_params

SQNR_CAP_DB = 200.0  # an exact match reports this instead of infinity (JSON has no infinity)


class ErrorStats:
    """Accumulates the sums that SQNR, relative MSE and cosine need; nothing else is kept."""

    def __init__(self):
        self.signal = self.noise = self.total = 0.0
        self.count = 0
        self.cos_sum = 0.0
        self.samples = 0

    def update(self, ref: torch.Tensor, approx: torch.Tensor) -> None:
        # per-image sums in the tensors' own precision (torch sums float32 pairwise), the
        # running totals in Python floats (float64): no float64 copy of a whole activation
        r = ref.detach().reshape(ref.shape[0] if ref.dim() else 1, -1)
        d = approx.detach().reshape(r.shape) - r
        noise = torch.linalg.vector_norm(d, dim=1).double() ** 2
        rr = torch.linalg.vector_norm(r, dim=1).double() ** 2
        rd = torch.bmm(r.unsqueeze(1), d.unsqueeze(2)).reshape(-1).double()  # one BLAS dot per image
        ra, aa = rr + rd, rr + 2 * rd + noise  # <r, a> and |a|^2 with a = r + d
        self.noise += float(noise.sum())
        self.signal += float(rr.sum())
        self.total += float(r.sum(dim=1).double().sum())
        self.count += r.numel()
        both_zero = (rr == 0) & (aa == 0)
        cos = torch.where(both_zero, torch.ones_like(ra), ra / torch.clamp((rr * aa).sqrt(), min=1e-300))
        self.cos_sum += float(cos.sum())
        self.samples += r.shape[0]

    def merge(self, other: "ErrorStats") -> None:
        for k in ("signal", "noise", "total", "count", "cos_sum", "samples"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    @property
    def sqnr_db(self) -> float:
        if self.noise == 0:
            return SQNR_CAP_DB
        if self.signal == 0:
            return -SQNR_CAP_DB
        return min(SQNR_CAP_DB, 10.0 * math.log10(self.signal / self.noise))

    @property
    def rel_mse(self) -> float:
        var = self.signal - (self.total ** 2 / self.count if self.count else 0.0)
        if self.noise == 0:
            return 0.0
        return self.noise / var if var > 0 else math.inf

    @property
    def noise_ratio(self) -> float:
        """Error power over signal power (the linear inverse of SQNR)."""
        return self.noise / self.signal if self.signal > 0 else (0.0 if self.noise == 0 else math.inf)

    @property
    def cosine(self) -> float:
        return self.cos_sum / self.samples if self.samples else 1.0

    def to_dict(self) -> dict:
        return {"sqnr_db": round(self.sqnr_db, 3), "cosine": round(self.cosine, 6),
                "rel_mse": _finite(self.rel_mse)}


def _finite(x: float, digits: int = 6):
    return None if not math.isfinite(x) else round(x, digits)


def sqnr_db(ref: np.ndarray, approx: np.ndarray) -> float:
    s = ErrorStats()
    s.update(torch.from_numpy(np.asarray(ref, np.float64).reshape(1, -1)),
             torch.from_numpy(np.asarray(approx, np.float64).reshape(1, -1)))
    return s.sqnr_db


def weight_stats(w: np.ndarray, axis: int, qmax: int = 127) -> dict:
    """Per output channel: min, max and max |w|; the spread of channel ranges (largest max |w|
    over the median), channels whose max |w| is over 4x the median (outlier channels), weights
    beyond 6 standard deviations of their channel (outlier weights), and the weight SQNR of
    int8 per-tensor (max |w|) against per-channel scales."""
    w = np.asarray(w, np.float32)
    wt = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    lo, hi = wt.min(axis=1), wt.max(axis=1)
    peak = np.abs(wt).max(axis=1)
    median = float(np.median(peak))
    std = wt.std(axis=1, keepdims=True)
    mean = wt.mean(axis=1, keepdims=True)
    outlier_weights = int((np.abs(wt - mean) > 6 * np.maximum(std, 1e-30)).sum())
    per_tensor = weight_params(w, None, qmax)
    per_channel = weight_params(w, axis, qmax)
    return {
        "channels": int(wt.shape[0]),
        "min": lo.tolist(), "max": hi.tolist(),
        "range_spread": _finite(float(peak.max()) / median if median > 0 else math.inf, 3),
        "outlier_channels": int((peak > 4 * median).sum()) if median > 0 else int((peak > 0).sum()),
        "outlier_weights": outlier_weights,
        "sqnr_per_tensor_db": round(sqnr_db(w, per_tensor.dequantize(per_tensor.quantize(w))), 3),
        "sqnr_per_channel_db": round(sqnr_db(w, per_channel.dequantize(per_channel.quantize(w))), 3),
    }
