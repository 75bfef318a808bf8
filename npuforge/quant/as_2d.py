"""1-D windowed ops of a quantized graph as their 2-D forms with H = 1, for back ends with 2-D kernels only.

A Conv, MaxPool, AveragePool, GlobalAveragePool or GlobalMaxPool on ``[N, C, L]`` becomes the same op on
``[N, C, 1, L]`` between an Unsqueeze and a Squeeze (axis 2): kernel, strides, dilations and pads gain
a leading 1 / 0, a Conv's weights (float and codes) a unit axis. Nothing is recomputed, so the integer
simulator gives the rewritten graph's outputs bit for bit. A chain of such ops (an audio front end, a
keyword spotter's separable blocks) stays 2-D: an op whose input another one rewrote reads that op's 2-D
output, and a Squeeze nothing reads any more is dropped. Used by the TFLite export (TFLite has CONV_2D
and the 2-D pools only) and the NPU compiler (its kernels are channel-last 2-D: a rank-3 value is stored
in the IR's element order, as tokens).
"""

from __future__ import annotations

import copy

import numpy as np

from ..ir.graph import Node, Value

WINDOWED = ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")


def windowed_1d(graph, node) -> bool:
    """A 1-D windowed op (a Conv with constant weights: the rewrite reshapes them)."""
    if node.op not in WINDOWED or len(graph.values[node.inputs[0]].shape or ()) != 3:
        return False
    return node.op != "Conv" or graph.values[node.inputs[1]].is_const


def as_2d(graph):
    """A copy of ``graph`` with every 1-D windowed op 2-D (``graph`` itself is left alone; a graph with
    none is returned as it is)."""
    if not any(windowed_1d(graph, n) for n in graph.nodes):
        return graph
    g = copy.deepcopy(graph)
    rewritten: dict[str, str] = {}  # a rewritten op's 1-D output -> its 2-D value
    squeezes: set[str] = set()
    nodes = []
    for node in g.nodes:
        if windowed_1d(g, node):
            nodes += _as_2d(g, node, rewritten)
            squeezes.add(nodes[-1].name)
        else:
            nodes.append(node)
    read = {i for n in nodes for i in n.inputs} | set(g.outputs)
    g.nodes = [n for n in nodes if n.name not in squeezes or n.outputs[0] in read]
    return g


def _as_2d(g, node, rewritten: dict) -> list:
    x, y = node.inputs[0], node.outputs[0]
    (n, c, length), yshape = g.values[x].shape, g.values[y].shape
    axes = add_constant(g, g.unique_name(f"{node.name}::h"), np.array([2], np.int64))
    nodes = []
    x4 = rewritten.get(x)
    if x4 is None:
        x4 = activation_like(g, g.unique_name(f"{node.name}::x2d"), x, (n, c, 1, length))
        nodes.append(Node(f"{node.name}::to2d", "Unsqueeze", [x, axes], [x4]))
    y4 = activation_like(g, g.unique_name(f"{node.name}::y2d"), y, (*yshape[:2], 1, yshape[2]))
    rewritten[y] = y4
    a = dict(node.attrs)
    for key in ("kernel_shape", "strides", "dilations"):
        if a.get(key) is not None:
            a[key] = [1, *a[key]]
    if a.get("pads") is not None:
        begin, end = a["pads"]
        a["pads"] = [0, begin, 0, end]
    inputs = [x4, *node.inputs[1:]]
    quant = dict(node.quant)
    if node.op == "Conv":  # the weights [Cout, Cin/g, K] as [Cout, Cin/g, 1, K], float and codes
        inputs[1] = _reshaped(g, inputs[1], lambda w: w[:, :, None, :])
        if "weight" in quant:
            quant["weight"] = _reshaped(g, quant["weight"], lambda w: w[:, :, None, :])
    return nodes + [Node(node.name, node.op, inputs, [y4], a, quant),
                    Node(f"{node.name}::to1d", "Squeeze", [y4, axes], [y])]


def activation_like(g, name: str, source: str, shape) -> str:
    """A new activation value ``name`` of ``shape`` on ``source``'s grid."""
    v = g.values[source]
    g.add_value(Value(name, v.dtype, tuple(shape), None, v.quant))
    return name


def add_constant(g, name: str, data) -> str:
    g.add_const(name, np.asarray(data))
    return name


def _reshaped(g, name: str, fn) -> str:
    v = g.values[name]
    new = g.unique_name(f"{name}::2d")
    data = np.ascontiguousarray(fn(np.asarray(v.data)))
    g.add_value(Value(new, v.dtype, tuple(data.shape), data, v.quant))
    return new
