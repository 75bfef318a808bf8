"""Exact rewrites of a quantized IR into ops TFLite has builtins for, before the export writes it.

Each rewrite moves codes or splits a node's integers; none computes anything new, so the integer
simulator gives the rewritten graph's outputs bit for bit (tests/test_tflite_vs_litert.py checks):

* a 1-D Conv or pool ([N, C, L]) becomes the 2-D op on [N, C, 1, L] between an Unsqueeze and a
  Squeeze (npuforge/quant/as_2d.py; TFLite has CONV_2D and the 2-D pools only);
* a grouped Conv that is not depthwise becomes a Split of its input channels, one Conv per group
  (its slice of the weights, biases, multipliers, shifts and bounds) and a Concat.
"""

from __future__ import annotations

import copy

import numpy as np

from ..ir.graph import Node, Value
from ..quant.as_2d import activation_like, add_constant, as_2d
from ..quant.params import QParams


def for_tflite(graph):
    """A copy of ``graph`` rewritten as the module's docstring says (``graph`` is left alone)."""
    g = as_2d(graph)
    g = copy.deepcopy(g) if g is graph else g
    nodes = []
    for node in g.nodes:
        if node.op == "Conv" and _grouped(g, node):
            nodes += _per_group(g, node)
        else:
            nodes.append(node)
    g.nodes = nodes
    return g


def _grouped(g, node) -> bool:
    group = node.attrs.get("group", 1)
    cin = g.values[node.inputs[0]].shape[1]
    cin_g = g.values[node.inputs[1]].shape[1]
    return group > 1 and not (group == cin and cin_g == 1)


def _sliced_params(p: QParams | None, lo: int, hi: int) -> QParams | None:
    if p is None or not p.per_channel:
        return p
    return QParams(p.dtype, p.scale[lo:hi], p.zero_point[lo:hi], p.axis)


def _per_group(g, node) -> list:
    x, y = node.inputs[0], node.outputs[0]
    group = node.attrs["group"]
    xs, ys = g.values[x].shape, g.values[y].shape
    cin_g, cout_g = xs[1] // group, ys[1] // group
    sizes = add_constant(g, g.unique_name(f"{node.name}::sizes"), np.full(group, cin_g, np.int64))
    parts = [activation_like(g, g.unique_name(f"{node.name}::in{k}"), x, (xs[0], cin_g, *xs[2:]))
             for k in range(group)]
    outs = [activation_like(g, g.unique_name(f"{node.name}::out{k}"), y, (ys[0], cout_g, *ys[2:]))
            for k in range(group)]
    nodes = [Node(f"{node.name}::split", "Split", [x, sizes], parts, {"axis": 1})]
    for k in range(group):
        lo, hi = k * cout_g, (k + 1) * cout_g
        inputs = [parts[k]] + [_channels(g, name, lo, hi, ys[1]) if name else name for name in node.inputs[1:]]
        quant = {role: _channels(g, name, lo, hi, ys[1]) for role, name in node.quant.items()}
        nodes.append(Node(f"{node.name}::group{k}", "Conv", inputs, [outs[k]], {**node.attrs, "group": 1}, quant))
    nodes.append(Node(f"{node.name}::concat", "Concat", outs, [y], {"axis": 1}))
    return nodes


def _channels(g, name: str, lo: int, hi: int, cout: int) -> str:
    """Output channels lo:hi of a per-output-channel constant (weights, biases, multipliers, shifts,
    bounds); a per-tensor one (one value) is shared as it is."""
    v = g.values[name]
    data = np.asarray(v.data)
    if data.ndim == 0 or data.shape[0] != cout:
        return name
    new = g.unique_name(f"{name}::{lo}")
    part = np.ascontiguousarray(data[lo:hi])
    g.add_value(Value(new, v.dtype, tuple(part.shape), part, _sliced_params(v.quant, lo, hi)))
    return new
