"""Shape inference over the IR: each node's op applies its shape rule, and the
values of small static tensors (shape arithmetic) propagate along."""

from __future__ import annotations

from ..errors import ShapeError
from ..ops.registry import TensorInfo, get_op


def input_infos(node, infos: dict) -> list:
    return [infos[name] if name else None for name in node.inputs]


def check_arity(op, node) -> None:
    lo, hi = op.inputs
    n_in = len(node.inputs)
    if not lo <= n_in <= hi or any(not node.inputs[i] for i in range(lo)):
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        raise ShapeError(f"node '{node.name}' ({node.op}) has {n_in} inputs ({lo} required), expected {want}")
    lo, hi = op.outputs
    if not lo <= len(node.outputs) <= hi:
        raise ShapeError(f"node '{node.name}' ({node.op}) has {len(node.outputs)} outputs, expected {lo} to {hi}")


def attr_problems(op, node) -> list[str]:
    problems = []
    for key in node.attrs:
        if key not in op.attrs:
            problems.append(f"node '{node.name}' ({node.op}): unknown attribute '{key}'")
    for key in op.attrs:
        if key not in node.attrs:
            problems.append(f"node '{node.name}' ({node.op}): attribute '{key}' is missing")
    return problems


def infer_node(node, ins: list) -> list[TensorInfo]:
    """Output infos (with propagated values where known) of one node."""
    op = get_op(node.op, f"node '{node.name}'")
    check_arity(op, node)
    outs = op.infer(node, ins)
    if len(outs) != len(node.outputs):
        raise ShapeError(f"node '{node.name}' ({node.op}) yields {len(outs)} outputs but names {len(node.outputs)}")
    values = op.propagate(node, ins, outs)
    if values is not None:
        for info, value in zip(outs, values):
            if value is not None and tuple(value.shape) == tuple(info.shape):
                info.value = value
    return outs


def graph_infos(graph) -> dict:
    """Infos of the graph inputs and constants, the starting point of inference."""
    infos = {}
    for name in graph.inputs:
        v = graph.values[name]
        infos[name] = TensorInfo(v.dtype, tuple(v.shape))
    for v in graph.constants():
        infos[v.name] = TensorInfo(v.dtype, tuple(v.shape), v.data)
    return infos


def infer_shapes(graph) -> None:
    """Recompute and store every node output's dtype and shape (after a rewrite)."""
    infos = graph_infos(graph)
    for node in graph.nodes:
        for name, info in zip(node.outputs, infer_node(node, input_infos(node, infos))):
            infos[name] = info
            value = graph.values[name]
            value.dtype, value.shape = info.dtype, tuple(info.shape)
