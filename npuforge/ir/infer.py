"""Shape inference over the IR: each node's op applies its shape rule, and the
values of small static tensors (shape arithmetic) propagate along."""

from __future__ import annotations

from ..errors import ShapeError
from ..ops.registry import TensorInfo, attr_value_problems, check_attr_values, get_op

# The largest tensor npuforge takes: 2^31 elements (ONNX Runtime's int32 indexing and any memory
# this side of it). A shape rule that gives more (a 2^40 batch, a Tile x2^30, a Resize x10^6) is
# refused before anything allocates it.
MAX_ELEMENTS = 1 << 31


def check_size(name: str, shape, where: str) -> None:
    """Refuse a static shape with a negative dim or more than MAX_ELEMENTS elements."""
    count = 1
    for d in shape or ():
        if isinstance(d, int):
            if d < 0:
                raise ShapeError(f"{where}: tensor '{name}' has a negative dimension in {list(shape)}")
            count *= d
    if count > MAX_ELEMENTS:
        raise ShapeError(f"{where}: tensor '{name}' of shape {list(shape)} has {count} elements, over "
                         f"npuforge's limit of 2^31 per tensor; use smaller dimensions")


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
    return problems + attr_value_problems(op, node)


def infer_node(node, ins: list) -> list[TensorInfo]:
    """Output infos (with propagated values where known) of one node."""
    op = get_op(node.op, f"node '{node.name}'")
    check_arity(op, node)
    check_attr_values(op, node)
    outs = op.infer(node, ins)
    if len(outs) != len(node.outputs):
        raise ShapeError(f"node '{node.name}' ({node.op}) yields {len(outs)} outputs but names {len(node.outputs)}")
    for name, info in zip(node.outputs, outs):
        check_size(name, info.shape, f"node '{node.name}' ({node.op})")
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
        check_size(name, v.shape, "graph input")
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
