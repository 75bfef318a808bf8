"""The fake-quant executor: float kernels, with every quantized value rounded to
its grid (quantize -> dequantize, round half to even, saturating) as it is
produced, and every quantized constant (weights, int32 bias) likewise.

``precision="float64"`` runs the kernels in float64. In float32 a value within
float32 noise of a rounding boundary takes one code or the other depending on the
kernel's summation order, and torch's convolutions pick that order by batch size:
on a per-tensor MobileNetV2 QAT program, whose layers amplify one code into up to
14 logit steps, the same 200 photos in batches of 25 and of 1 disagreed on 15
top-1s (ONNX Runtime's QDQ run: on none). In float64 every code is the rounding of
the QDQ graph's exact value but for boundary cases 2^29 times rarer, whatever the
batch; it takes about twice as long. The graph's inputs are the exception: they are
float32 images, quantized in float32 as the integer program's host does (QuantizeLinear),
then carried on in float64; dividing them by the scale in float64 instead moved whole
pixel values across a code boundary. Quantized constants (weights, biases) are likewise
dequantized in float64: dequantized in float32, a weight's rounding (up to 2^-24 of it)
moved sums within that of a half-step to the other code (263 of 3.2 million codes of a
per-tensor MobileNetV2's first depthwise convolution on 8 photos, uniform patches whose
exact value is 69.5000008 steps; the integer simulator rounds them up, as the exact value).
"""

from __future__ import annotations

import numpy as np
import torch

from ..quant.params import check_finite
from .float_exec import execute
from .integer import integer_kind, quantize_input

ENGINE = "fake-quant"
# quantization kinds whose float function of finite codes is never NaN
_NO_NAN = ("compute", "matmul", "elementwise", "pool", "passthrough", "concat", "interpolate", "prelu", "minmax")

PRECISIONS = ("float32", "float64")


def run_fake_quant(graph, feeds: dict, outputs: list[str] | None = None, *, precision: str = "float32") -> dict:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    wide = precision == "float64"
    quantized = {name: v.quant for name, v in graph.values.items() if v.quant is not None and not v.is_const}
    inputs = set(graph.inputs)
    # who computes each value: a node the integer program runs in float is checked whole for NaN and
    # infinities (as the integer simulator checks it); a quantized table or normalization (a float function
    # that may be undefined on finite codes: the square root of a negative one) for NaN (an infinity out of
    # its float function, log(0), is the grid's end, as its table has it); the other kinds' float functions
    # of finite codes are not NaN (not checked: the cost would be one more pass over every activation)
    producer = {o: node for node in graph.nodes for o in node.outputs if o}
    kinds = {o: integer_kind(graph, node) for node in graph.nodes for o in node.outputs if o}
    in_float = {o for o, kind in kinds.items() if kind is None}
    maybe_nan = {o for o, kind in kinds.items() if kind is not None and kind not in _NO_NAN}

    def what(name: str) -> str:
        node = producer.get(name)
        return f"node '{node.name}' ({node.op}) output '{name}'" if node is not None else f"input '{name}'"

    def widen(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float64) if wide and t.is_floating_point() else t

    def value_hook(name: str, t: torch.Tensor) -> torch.Tensor:
        p = quantized.get(name)
        if t.is_floating_point() and (name in inputs or name in in_float):
            check_finite(t, what(name), ENGINE)
        if p is not None and wide and name in inputs:  # the integer program's input codes, in float64
            return p.dequantize_torch(torch.from_numpy(quantize_input(t.numpy(), p)), torch.float64)
        t = widen(t)
        if p is None:
            return t
        t = p.fake_quant(t)
        if name in maybe_nan and not bool(torch.isfinite(t.sum())):  # on the grid only NaN is not finite
            check_finite(t, what(name), ENGINE)
        return t

    def const_hook(value, t: torch.Tensor) -> torch.Tensor:
        if value.quant is None:
            return widen(t)
        codes = value.quant.quantize(value.data)
        if wide:  # not through float32: a weight's rounding there moved sums across code boundaries
            return value.quant.dequantize_torch(torch.from_numpy(codes), torch.float64)
        return torch.from_numpy(value.quant.dequantize(codes))

    if wide:
        feeds = {k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else v for k, v in feeds.items()}
    out = execute(graph, feeds, outputs, value_hook=value_hook, const_hook=const_hook)
    if wide:  # the graph's own output dtypes
        out = {k: v.astype(graph.values[k].dtype) if v.dtype == np.float64 and graph.values[k].dtype == "float32"
               else v for k, v in out.items()}
    return out


def is_quantized(graph) -> bool:
    return any(v.quant is not None for v in graph.values.values())
