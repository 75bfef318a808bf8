"""Float-graph rewrites before quantizing for the TFLite export (``target='tflite'``): each turns
an op whose integer program has no TFLite form into ops that have one, so that the quantized
graph's every node is a TFLite builtin's integer program (and the simulator equals LiteRT).

* A fused LeakyRelu: npuforge requantizes a Conv / Gemm's negative accumulators with a second
  multiplier; TFLite has no fused LeakyRelu. Split off again, the convolution gets its own
  output grid and the LeakyRelu becomes LiteRT's LEAKY_RELU (quant/tflite_tables.py).
* LayerNormalization / InstanceNormalization (npuforge's integer rule, an exact integer mean,
  variance and square root, is no TFLite program): ``d = x - mean(x)``,
  ``d * (mean(d * d) + eps) ^ -0.5 * scale + bias`` as MEAN, SUB, MUL, MEAN, ADD, a table of
  ``v ^ -0.5`` (GATHER), MUL, MUL, ADD: the same function in float, each step requantized on its
  calibrated grid (the int8 variance costs accuracy: docs/tflite.md gives the measured figure).
* L2Normalize: ``x * max(n * mean(x * x), eps^2) ^ -0.5`` as MUL, MEAN, MUL, a Clip table, a
  ``v ^ -0.5`` table, MUL.
* Div by a computed value (linear attention's ``x / (sum + eps)``): ``x * (1 / d)`` as a table of
  ``1 / d`` on the divisor's grid (GATHER) and MUL. LiteRT's int8 DIV is no exact oracle: for a
  numerator of 0 or -1 less its zero point (after it moves the divisor's sign) its rounding shift
  can reach 32 bits, undefined in C++; on x86, ai-edge-litert 2.3.0 then returns the zero point
  + 1 for 0 / d and saturates -1 / d to -128 (over every int8 code pair: 528 and 12 of 65,280
  outputs for two of three scale sets tried, none for the third).
* ReduceSum over n elements: ``mean(x) * n`` as MEAN and MUL by the constant n. LiteRT's reference
  int8 SUM does not compute the program it implements (the sum of ``x - zp`` requantized once):
  with ai-edge-litert 2.3.0, 1,413 of 1,444 codes over four small sums differed from it, most -1.
  The mean's calibrated grid is the sum's divided by n, so its codes are the sum's but for a rounding
  now and then (docs/tflite.md gives the measured figure).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Node, Value
from ..ops.registry import get_op


def split_fused_leaky_relu(graph) -> int:
    """Every Conv / Gemm with a fused LeakyRelu becomes the op and a LeakyRelu node, in place;
    -> how many were split."""
    split = 0
    for index in reversed(range(len(graph.nodes))):
        node = graph.nodes[index]
        if node.attrs.get("activation") != "LeakyRelu":
            continue
        y = graph.values[node.outputs[0]]
        pre = graph.add_value(Value(graph.unique_name(f"{node.name}::pre_activation"), y.dtype, y.shape))
        alpha = float(node.attrs["activation_params"][0])
        node.attrs["activation"], node.attrs["activation_params"] = "", []
        graph.nodes.insert(index + 1, Node(f"{node.name}::leaky_relu", "LeakyRelu", [pre.name], [y.name],
                                           {"alpha": alpha}))
        node.outputs = [pre.name]
        split += 1
    return split


class _Builder:
    """Appends float nodes in place of one node, each output a new value of the given shape."""

    def __init__(self, graph, node):
        self.g, self.node, self.nodes = graph, node, []

    def const(self, role: str, data) -> str:
        name = self.g.unique_name(f"{self.node.name}::{role}")
        self.g.add_const(name, np.asarray(data, np.float32))
        return name

    def const_int(self, role: str, data) -> str:
        name = self.g.unique_name(f"{self.node.name}::{role}")
        self.g.add_const(name, np.asarray(data, np.int64))
        return name

    def op(self, op: str, inputs: list, shape, out: str | None = None, **attrs) -> str:
        dtype = self.g.values[inputs[0]].dtype
        if out is None:
            out = self.g.unique_name(f"{self.node.name}::{op.lower()}")
            self.g.add_value(Value(out, dtype, tuple(shape)))
        self.nodes.append(Node(f"{self.node.name}::{op}_{len(self.nodes)}", op, inputs, [out],
                               {**get_op(op).attrs, **attrs}))
        return out


def _replace(graph, rewrite) -> int:
    """Each node for which ``rewrite(builder)`` returns True is replaced by the builder's nodes."""
    nodes, count = [], 0
    for node in graph.nodes:
        b = _Builder(graph, node)
        if rewrite(b):
            nodes += b.nodes
            count += 1
        else:
            nodes.append(node)
    graph.nodes = nodes
    return count


def _normalization(b: _Builder) -> bool:
    """LayerNormalization (over the axes from ``axis`` on) and InstanceNormalization (over the
    spatial axes, per-channel scale and bias) with constant parameters."""
    node, g = b.node, b.g
    params = [i for i in node.inputs[1:] if i]
    if node.op not in ("LayerNormalization", "InstanceNormalization") or \
            len([o for o in node.outputs if o]) != 1 or not all(g.values[i].is_const for i in params):
        return False
    x = node.inputs[0]
    shape = g.values[x].shape
    rank = len(shape)
    instance = node.op == "InstanceNormalization"
    axes = list(range(2, rank)) if instance else list(range(node.attrs["axis"] % rank, rank))
    kept = tuple(1 if k in axes else d for k, d in enumerate(shape))
    axes_t = b.const_int("axes", axes)
    mean = b.op("ReduceMean", [x, axes_t], kept, keepdims=1)
    d = b.op("Sub", [x, mean], shape)
    var = b.op("ReduceMean", [b.op("Mul", [d, d], shape), axes_t], kept, keepdims=1)
    shifted = b.op("Add", [var, b.const("epsilon", node.attrs["epsilon"])], kept)
    inv = b.op("Pow", [shifted, b.const("minus_half", -0.5)], kept)
    y = node.outputs[0]
    scale = node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    if instance:  # per channel: [C] -> [C, 1, ...] to broadcast over the spatial axes
        scale = b.const("scale", np.asarray(g.values[scale].data).reshape(-1, *([1] * (rank - 2))))
        bias = b.const("bias", np.asarray(g.values[bias].data).reshape(-1, *([1] * (rank - 2))))
    normed = b.op("Mul", [d, inv], shape)
    scaled = b.op("Mul", [normed, scale], shape, out=None if bias else y)
    if bias:
        b.op("Add", [scaled, bias], shape, out=y)
    return True


def _l2_normalize(b: _Builder) -> bool:
    """L2Normalize: ``x * (max(n * mean(x * x), eps^2)) ^ -0.5`` over its axes (n elements)."""
    node, g = b.node, b.g
    if node.op != "L2Normalize":
        return False
    x = node.inputs[0]
    shape = g.values[x].shape
    rank = len(shape)
    axes = sorted(a % rank for a in node.attrs["axes"])
    kept = tuple(1 if k in axes else d for k, d in enumerate(shape))
    count = int(np.prod([shape[a] for a in axes]))
    mean = b.op("ReduceMean", [b.op("Mul", [x, x], shape), b.const_int("axes", axes)], kept, keepdims=1)
    total = b.op("Mul", [mean, b.const("count", float(count))], kept)
    eps = float(node.attrs["epsilon"])
    if eps > 0:
        total = b.op("Clip", [total, b.const("eps_squared", eps * eps)], kept)
    inv = b.op("Pow", [total, b.const("minus_half", -0.5)], kept)
    b.op("Mul", [x, inv], shape, out=node.outputs[0])
    return True


def _reduce_sum(b: _Builder) -> bool:
    """A float ReduceSum over constant axes of static size n: ``ReduceMean(x) * n``."""
    node, g = b.node, b.g
    y = node.outputs[0]
    if node.op != "ReduceSum" or g.values[y].dtype not in ("float16", "float32", "float64"):
        return False
    x, given = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else ""
    shape = g.values[x].shape or ()
    if given and not g.values[given].is_const:
        return False
    axes = sorted({int(a) % len(shape) for a in np.asarray(g.values[given].data).reshape(-1)}) if given else []
    if not axes and node.attrs["noop_with_empty_axes"]:
        return False
    axes = axes or list(range(len(shape)))
    if not all(isinstance(shape[a], int) for a in axes):
        return False
    count = int(np.prod([shape[a] for a in axes]))
    mean = b.op("ReduceMean", [x, b.const_int("axes", axes)], g.values[y].shape, keepdims=node.attrs["keepdims"])
    b.op("Mul", [mean, b.const("count", float(count))], g.values[y].shape, out=y)
    return True


def _divide(b: _Builder) -> bool:
    """A float Div by a computed value: ``a * Reciprocal(d)`` (a table of ``1 / d`` as GATHER, then MUL)."""
    node, g = b.node, b.g
    if node.op != "Div" or g.values[node.outputs[0]].dtype not in ("float16", "float32", "float64"):
        return False
    a, d = node.inputs[:2]
    if g.values[d].is_const:
        return False  # (a Mul already, by passes/div_by_constant.py)
    inverse = b.op("Reciprocal", [d], g.values[d].shape)
    b.op("Mul", [a, inverse], g.values[node.outputs[0]].shape, out=node.outputs[0])
    return True


def decompose_for_tflite(graph) -> dict:
    """The normalizations, ReduceSum and Div by a computed value as TFLite builtins' float
    functions, in place; -> counts."""
    return {"normalizations": _replace(graph, _normalization),
            "L2Normalize": _replace(graph, _l2_normalize), "ReduceSum": _replace(graph, _reduce_sum),
            "Div": _replace(graph, _divide)}
