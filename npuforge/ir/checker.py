"""The IR checker: structure (names, dangling references, order, cycles),
attributes, and every node's shapes and dtypes against its op's shape rule."""

from __future__ import annotations

from ..errors import CheckError, NpuforgeError
from ..ops.registry import get_op
from .dtypes import FLOAT_DTYPES
from .graph import format_shape
from .infer import attr_problems, graph_infos, infer_node, input_infos


def check_graph(graph) -> None:
    problems = find_problems(graph)
    if problems:
        raise CheckError(problems)


def _cycle(graph) -> list[str]:
    """Names of nodes on a cycle (Kahn's algorithm leaves them unprocessed)."""
    producer = graph.producers()
    pending = {id(n): sum(1 for i in set(n.inputs) if i in producer) for n in graph.nodes}
    users = graph.consumers()
    ready = [n for n in graph.nodes if pending[id(n)] == 0]
    done = set()
    while ready:
        n = ready.pop()
        done.add(id(n))
        for out in set(n.outputs):
            for user in users.get(out, []):
                pending[id(user)] -= 1
                if pending[id(user)] == 0:
                    ready.append(user)
    return [n.name for n in graph.nodes if id(n) not in done]


def find_problems(graph) -> list[str]:
    problems: list[str] = []
    values = graph.values

    # names
    seen_nodes, produced = set(), {}
    for name in graph.inputs:
        if name not in values:
            problems.append(f"graph input '{name}' has no value entry")
        elif values[name].is_const:
            problems.append(f"graph input '{name}' is also a constant")
    for n in graph.nodes:
        if n.name in seen_nodes:
            problems.append(f"duplicate node name '{n.name}'")
        seen_nodes.add(n.name)
        for out in n.outputs:
            if not out:
                problems.append(f"node '{n.name}' ({n.op}) has an unnamed output")
            elif out in produced:
                problems.append(f"value '{out}' is produced by both '{produced[out]}' and '{n.name}'")
            elif out in graph.inputs or (out in values and values[out].is_const):
                problems.append(f"node '{n.name}' ({n.op}) overwrites graph input or constant '{out}'")
            else:
                produced[out] = n.name
            if out and out not in values:
                problems.append(f"node '{n.name}' ({n.op}) output '{out}' has no value entry")

    # references and order
    available = set(graph.inputs) | {v.name for v in graph.constants()}
    misordered = False
    for n in graph.nodes:
        for i in n.inputs:
            if i and i not in available:
                if i in produced:
                    misordered = True
                else:
                    problems.append(f"node '{n.name}' ({n.op}) reads '{i}', which nothing produces (dangling)")
        available.update(o for o in n.outputs if o)
    if misordered:
        cycle = _cycle(graph)
        if cycle:
            problems.append(f"cycle through nodes {', '.join(repr(c) for c in cycle[:8])}")
        else:
            problems.append("nodes are not in topological order")
    if not graph.outputs:
        problems.append("the graph has no outputs; a model must name at least one")
    for name in graph.outputs:
        if name not in available:
            problems.append(f"graph output '{name}' is not produced by any node (dangling)")
    if problems:
        return problems  # shape inference needs a sound structure

    # ops, attributes, shapes
    infos = graph_infos(graph)
    for n in graph.nodes:
        try:
            op = get_op(n.op, f"node '{n.name}'")
        except NpuforgeError as e:
            problems.append(str(e))
            break
        bad_attrs = attr_problems(op, n)
        if bad_attrs:
            problems += bad_attrs
            break
        try:
            outs = infer_node(n, input_infos(n, infos))
        except NpuforgeError as e:
            problems.append(str(e))
            break  # later shapes would only repeat this one
        for name, info in zip(n.outputs, outs):
            infos[name] = info
            v = values[name]
            if v.dtype != info.dtype or tuple(v.shape or ()) != tuple(info.shape):
                problems.append(
                    f"node '{n.name}' ({n.op}): output '{name}' is recorded as {v.dtype}{format_shape(v.shape)} "
                    f"but the shape rule gives {info.dtype}{format_shape(info.shape)}"
                )
    if problems:
        return problems  # the quantization checks ask the ops (quant_kind), which read sound attributes
    return _quant_problems(graph)


# The integers the quantizer always writes for a kind it gives an integer program (quant/quantize.py
# _quantize_node: a requantization for pools and matmuls, the weight codes for a compute op); a node it
# keeps in float has none.
_KIND_ROLES = {"compute": ("weight",), "pool": ("multiplier", "shift"), "matmul": ("multiplier", "shift")}
# (a, b): a node with integer a has b (a shift alone is legal: LayerNorm's rule has no multiplier)
_PAIRED_ROLES = (("multiplier", "shift"), ("act_min", "act_max"), ("act_max", "act_min"))


def _quant_problems(graph) -> list[str]:
    """Quantization annotations: parameters that fit their value, integers that exist."""
    problems = []
    for v in graph.values.values():
        p = v.quant
        if p is None:
            continue
        if p.axis is not None and (v.shape is None or not 0 <= p.axis < len(v.shape)
                                   or (isinstance(v.shape[p.axis], int) and p.scale.shape != (v.shape[p.axis],))):
            problems.append(f"value '{v.name}': per-channel parameters on axis {p.axis} do not fit its shape "
                            f"{format_shape(v.shape)}")
        if not (p.zero_point >= p.qmin).all() or not (p.zero_point <= p.qmax).all() or not (p.scale > 0).all():
            problems.append(f"value '{v.name}': zero point outside {p.dtype} or a non-positive scale")
    for n in graph.nodes:
        out = graph.values.get(n.outputs[0]) if n.outputs and n.outputs[0] else None
        if n.quant and out is not None and out.quant is not None:  # an integer program: all of it
            for role in _KIND_ROLES.get(get_op(n.op).quant_kind(n, graph), ()):
                if role not in n.quant:
                    problems.append(f"node '{n.name}' ({n.op}): quantization integer '{role}' is missing; "
                                    f"quantize the model again")
            for name in n.inputs:  # it computes on codes: every float activation it reads has a grid
                v = graph.values.get(name) if name else None
                if v is not None and not v.is_const and v.quant is None and v.dtype in FLOAT_DTYPES:
                    problems.append(f"node '{n.name}' ({n.op}): input '{name}' has no quantization parameters, "
                                    f"but the node computes on codes; quantize the model again")
        for a, b in _PAIRED_ROLES:  # a requantization's multiplier comes with its shift; a clamp has both bounds
            if a in n.quant and b not in n.quant:
                problems.append(f"node '{n.name}' ({n.op}): quantization integer '{b}' is missing beside '{a}'; "
                                f"quantize the model again")
        for role, name in n.quant.items():
            v = graph.values.get(name)
            if v is None or not v.is_const or v.dtype not in ("int8", "uint8", "int16", "int32", "int64"):
                problems.append(f"node '{n.name}' ({n.op}): quantization integer '{role}' names '{name}', "
                                f"which is not an integer constant")
    return problems
