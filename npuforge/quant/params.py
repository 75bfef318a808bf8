"""Quantization parameters of a value (tensor): dtype, scale, zero point, axis.

    real = scale * (q - zero_point),   q in [qmin, qmax] of the dtype

Rounding is round-half-to-even everywhere (as ONNX QuantizeLinear does), and
every range is widened to contain 0 so that 0.0 (padding, ReLU) is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import NpuforgeError

QRANGES = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "int32": (-(2**31), 2**31 - 1),
}
# Symmetric signed types leave out the most negative code so that +-range are both exact.
SYMMETRIC_QRANGES = {"int8": (-127, 127), "int16": (-32767, 32767), "int32": (-(2**31) + 1, 2**31 - 1)}
_TINY = np.float32(1e-12)  # scale floor for an all-zero tensor


@dataclass
class QParams:
    dtype: str
    scale: np.ndarray  # float32, shape () per tensor or (C,) per channel
    zero_point: np.ndarray  # int32, same shape as scale
    axis: int | None = None  # the channel axis when per channel

    def __post_init__(self):
        self.scale = np.asarray(self.scale, np.float32)
        self.zero_point = np.asarray(self.zero_point, np.int32)
        if self.scale.shape != self.zero_point.shape:
            raise ValueError("scale and zero_point shapes differ")
        if (self.axis is None) != (self.scale.ndim == 0):
            raise ValueError("axis must be given exactly when scale is per channel")

    @property
    def qmin(self) -> int:
        return QRANGES[self.dtype][0]

    @property
    def qmax(self) -> int:
        return QRANGES[self.dtype][1]

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "axis": self.axis, "scale": self.scale.tolist(),
                "zero_point": self.zero_point.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> "QParams":
        """From ``to_json``'s object; ValueError naming what is wrong with any other."""
        if not isinstance(d, dict) or not {"dtype", "scale", "zero_point"} <= d.keys():
            raise ValueError("a quantization entry must be an object with dtype, scale, zero_point and axis")
        if d["dtype"] not in QRANGES:
            raise ValueError(f"quantization dtype {d['dtype']!r:.40} is not one of {', '.join(QRANGES)}")
        axis = d.get("axis")
        if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < 64):
            raise ValueError(f"quantization axis {axis!r:.40} is not a dimension index")
        scale, zero_point = np.array(d["scale"], np.float64), np.array(d["zero_point"], np.float64)
        if not np.isfinite(scale).all() or not np.isfinite(zero_point).all() or scale.ndim > 1:
            raise ValueError("quantization scale and zero_point must be finite numbers (one per channel at most)")
        # checked before the casts, which would turn them into inf or an arbitrary int32 with a numpy warning
        if np.abs(scale).max(initial=0) > np.finfo(np.float32).max:
            raise ValueError("a quantization scale is beyond float32's range")
        lo, hi = QRANGES[d["dtype"]]
        if (zero_point != np.round(zero_point)).any() or (zero_point < lo).any() or (zero_point > hi).any():
            raise ValueError(f"a quantization zero_point must be an integer in {d['dtype']}'s range [{lo}, {hi}]")
        return cls(d["dtype"], scale.astype(np.float32), zero_point.astype(np.int32), axis)

    def same_as(self, other: "QParams") -> bool:
        return (self.dtype == other.dtype and self.axis == other.axis
                and np.array_equal(self.scale, other.scale) and np.array_equal(self.zero_point, other.zero_point))

    def _broadcast(self, arr, ndim: int):
        if self.axis is None:
            return arr
        shape = [1] * ndim
        shape[self.axis] = -1
        return arr.reshape(shape)

    # numpy: used for weights, biases and tables
    def quantize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        s = self._broadcast(self.scale, x.ndim)
        z = self._broadcast(self.zero_point, x.ndim).astype(np.float64)
        q = np.rint(x / s) + z  # clip while still float: a huge x / s must saturate, not wrap
        return np.asarray(np.clip(q, self.qmin, self.qmax), dtype=_NP_INT[self.dtype])

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q)
        s = self._broadcast(self.scale, q.ndim)
        z = self._broadcast(self.zero_point, q.ndim)
        return np.asarray((q.astype(np.int64) - z) * s.astype(np.float64), dtype=np.float32)

    def dequantize_torch(self, q: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """:meth:`dequantize` on a torch tensor of codes, in float32: the same numbers, since
        ``q - zp`` is an integer below 2^24 and one float32 product of two float32 numbers is
        correctly rounded, as the float64 product rounded to float32 is (``dtype=torch.float64``:
        that product unrounded)."""
        np_dtype = np.float64 if dtype == torch.float64 else np.float32
        s = torch.from_numpy(self._broadcast(self.scale, q.dim()).astype(np_dtype))
        z = torch.from_numpy(self._broadcast(self.zero_point.astype(np_dtype), q.dim()))
        return (q.to(dtype) - z).mul_(s)

    # torch: used by the fake-quant executor on activations
    def fake_quant(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.from_numpy(self._broadcast(self.scale, x.dim()))
        z = torch.from_numpy(self._broadcast(self.zero_point.astype(np.float32), x.dim()))
        q = (x / s).round_().add_(z).clamp_(self.qmin, self.qmax)  # in place: activations are large
        return q.sub_(z).mul_(s)


_NP_INT = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32}


def check_finite(t, what: str, engine: str) -> None:
    """NpuforgeError when the float tensor or array ``t`` holds NaN or an infinity, naming
    ``what`` (the node and value, or the input) and the engine. Where a float value becomes
    codes, NaN has no code (a cast makes it an arbitrary one) and an infinity would become the
    grid's end without a word: the integer simulator and fake-quant check every input and every
    value a node kept in float computes."""
    arr = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    if arr.dtype.kind != "f" or np.isfinite(arr).all():
        return
    nan = int(np.isnan(arr).sum())
    inf = int(np.isinf(arr).sum())
    found = " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "infinite")) if n)
    fix = "fix the input data" if what.startswith("input") else \
        "fix the computation there (a divisor whose epsilon is below its grid's step becomes 0: keep the node " \
        "adding the epsilon in float, --keep-float NODE)"
    raise NpuforgeError(f"{what} holds {found} value(s) of {arr.size} in {engine}: an integer program has no NaN "
                        f"or infinity (as a code it would be arbitrary, or the grid's end); {fix}")


def from_range(lo, hi, dtype: str, symmetric: bool, axis: int | None = None) -> QParams:
    """Parameters that cover [lo, hi] (widened to contain 0), per tensor or per channel."""
    lo = np.minimum(np.asarray(lo, np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, np.float64), 0.0)
    if symmetric:
        bound = np.maximum(-lo, hi)
        if dtype == "uint8":
            # a symmetric uint8 keeps zero at 128 (see to_symmetric)
            scale = bound / 127.5
            zp = np.full(bound.shape, 128)
        else:
            qmax = SYMMETRIC_QRANGES[dtype][1]
            scale = bound / qmax
            zp = np.zeros(bound.shape)
        scale = np.maximum(scale, _TINY)
    else:
        qmin, qmax = QRANGES[dtype]
        scale = np.maximum((hi - lo) / (qmax - qmin), _TINY)
        zp = np.clip(np.rint(qmin - lo / scale), qmin, qmax)
    return QParams(dtype, scale.astype(np.float32), zp.astype(np.int32), axis)


def to_symmetric(p: QParams) -> QParams:
    """Asymmetric -> symmetric parameters covering at least the same real range."""
    lo = (p.qmin - p.zero_point.astype(np.float64)) * p.scale
    hi = (p.qmax - p.zero_point.astype(np.float64)) * p.scale
    return from_range(lo, hi, p.dtype, symmetric=True, axis=p.axis)


def weight_params(w: np.ndarray, axis: int | None, qmax: int = 127, clip: np.ndarray | None = None) -> QParams:
    """Symmetric int8 weight parameters mapping max |w| (per channel along ``axis``, or
    per tensor), or a given clipping bound, to ``qmax`` (127; 63 for reduced range)."""
    if clip is None:
        if axis is None:
            clip = np.abs(w).max() if w.size else 0.0
        else:
            reduce = tuple(i for i in range(w.ndim) if i != axis)
            clip = np.abs(w).max(axis=reduce) if reduce else np.abs(w)
    scale = np.maximum(np.asarray(clip, np.float64) / qmax, _TINY)
    return QParams("int8", scale.astype(np.float32), np.zeros(scale.shape, np.int32), axis)
