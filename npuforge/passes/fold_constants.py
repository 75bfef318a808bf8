"""Constant folding.

* A node whose every input is a constant becomes constants (its outputs keep
  their names): the float forward of its op computes them. This folds the
  Identity nodes the torch exporter puts on shared weights, weight transposes,
  and the ConstantOfShape/Concat/Reshape/Slice/Transpose/Cast chains that
  compute a Pad's pads.
* Shape subgraphs: a node whose outputs the shape rule knows exactly (``Shape``
  of an input with a static shape, and everything computed from it) becomes a
  constant too, even though its input is not constant.
* With a symbolic batch dim, a Reshape target known only up to symbols
  (``[N, -1]`` from Shape -> Gather -> Unsqueeze -> Concat) becomes a constant
  target when each symbol is the input's dim at the same position (written
  ``0``, "copy the input dim") or is the only unknown (written ``-1``).

Outputs larger than :data:`MAX_ELEMENTS` are not folded (a ConstantOfShape
could otherwise blow up the weights file).
"""

from __future__ import annotations

import numpy as np
import torch

from ..ir import dtypes
from ..ir.infer import graph_infos, infer_node, input_infos
from ..ops.registry import TensorInfo, get_op
from .manager import register_pass
from .rewrite import const, make_const, new_const, prune

MAX_ELEMENTS = 1 << 24


def _forward(graph, node) -> list:
    xs = [None if not name else torch.from_numpy(np.array(graph.values[name].data)) for name in node.inputs]
    with torch.no_grad():
        ys = get_op(node.op).forward(node, xs)
    return [y.numpy() for y in ys]


def _as_recorded(graph, node, arrays) -> list:
    """The folded arrays in the dtypes the graph records for the outputs."""
    return [np.asarray(a).astype(dtypes.to_numpy(graph.values[name].dtype), copy=False)
            for name, a in zip(node.outputs, arrays)]


def _foldable_value(info) -> bool:
    return info.value is not None and info.value.dtype != object


def _reshape_target(graph, node, infos) -> np.ndarray | None:
    """A constant target for a Reshape whose target value is known up to symbols."""
    if node.op != "Reshape" or const(graph, node.inputs[1]) is not None:
        return None
    value = infos[node.inputs[1]].value
    if value is None:
        return None
    target = list(np.asarray(value).reshape(-1))
    x_shape = graph.values[node.inputs[0]].shape
    out = []
    unknown = 0
    for i, d in enumerate(target):
        if isinstance(d, str):
            if i < len(x_shape) and x_shape[i] == d:
                out.append(0)
            else:
                unknown += 1
                out.append(-1)
        else:
            d = int(d)
            if d == 0 and node.attrs["allowzero"]:
                return None  # a literal 0 would turn into "copy" if allowzero had to be dropped
            out.append(d)
    if unknown > 1 or (unknown == 1 and out.count(-1) > 1):
        return None
    return np.array(out, np.int64)


def _const_info(v) -> TensorInfo:
    return TensorInfo(v.dtype, tuple(v.shape), v.data)


def _fold_once(graph) -> int:
    """One sweep in order; the values the shape rules propagate flow along."""
    changes = 0
    infos = graph_infos(graph)
    for node in list(graph.nodes):
        present = [i for i in node.inputs if i]
        ins = input_infos(node, infos)
        outs = infer_node(node, ins)
        folded = None
        if present and all(graph.values[i].is_const for i in present):
            if not any(any(isinstance(d, str) for d in o.shape) for o in outs) and \
                    sum(int(np.prod(o.shape, dtype=np.int64)) for o in outs) <= MAX_ELEMENTS:
                folded = _forward(graph, node)
        elif outs and all(_foldable_value(o) for o in outs):
            folded = [np.array(o.value) for o in outs]
        if folded is not None:
            make_const(graph, node, _as_recorded(graph, node, folded))
            for name in node.outputs:
                infos[name] = _const_info(graph.values[name])
            changes += 1
            continue
        target = _reshape_target(graph, node, infos)
        if target is not None:
            node.inputs[1] = new_const(graph, f"{node.name}/target", target)
            node.attrs["allowzero"] = 0
            infos[node.inputs[1]] = _const_info(graph.values[node.inputs[1]])
            changes += 1
        for name, info in zip(node.outputs, outs):
            infos[name] = info
    return changes


@register_pass("fold_constants", "nodes with only constant inputs, and static shape subgraphs, become constants")
def fold_constants(graph) -> int:
    total = 0
    while True:
        changes = _fold_once(graph)
        total += changes
        if not changes:
            break
    prune(graph)
    return total
