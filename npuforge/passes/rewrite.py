"""Small graph-rewriting helpers shared by the passes.

The passes mutate the graph they are given; :func:`copy_graph` makes the copy
that :func:`npuforge.passes.optimize` works on, so the caller's graph is never
touched. Constant arrays are shared between a graph and its copy: no pass
writes into an array, every folded weight is a new array under a new name.
"""

from __future__ import annotations

import copy

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.infer import infer_node, infer_shapes


def copy_graph(graph: Graph) -> Graph:
    """A structural copy: new Graph, Values and Nodes (node attributes and graph
    metadata deep-copied); constant arrays are shared (treated as read-only).
    Fields added to Graph/Value/Node later are carried along (shallow)."""
    g = copy.copy(graph)
    g.inputs = list(graph.inputs)
    g.outputs = list(graph.outputs)
    g.values = {k: copy.copy(v) for k, v in graph.values.items()}
    nodes = []
    for n in graph.nodes:
        m = copy.copy(n)
        m.inputs, m.outputs, m.attrs = list(n.inputs), list(n.outputs), copy.deepcopy(n.attrs)
        if isinstance(getattr(n, "quant", None), dict):
            m.quant = dict(n.quant)
        nodes.append(m)
    g.nodes = nodes
    if isinstance(getattr(graph, "metadata", None), dict):
        g.metadata = copy.deepcopy(graph.metadata)
    return g


# -- queries -------------------------------------------------------------------


def const(graph: Graph, name: str) -> np.ndarray | None:
    """The data of a constant value, or None (also for "" and non-constants)."""
    if not name:
        return None
    v = graph.values.get(name)
    return None if v is None else v.data


def scalar(graph: Graph, name: str) -> float | None:
    """A constant with exactly one element as a Python float, else None."""
    data = const(graph, name)
    if data is None or data.size != 1:
        return None
    return float(data.reshape(-1)[0])


def single_consumer(graph: Graph, name: str, users: dict | None = None) -> Node | None:
    """The only node reading ``name`` (once), if ``name`` is not a graph output."""
    if name in graph.outputs:
        return None
    users = graph.consumers() if users is None else users
    readers = users.get(name, [])
    if len(readers) != 1 or readers[0].inputs.count(name) != 1:
        return None
    return readers[0]


def used_names(graph: Graph) -> set:
    used = set(graph.outputs)
    for n in graph.nodes:
        used.update(i for i in n.inputs if i)
    return used


# -- edits ---------------------------------------------------------------------


def new_const(graph: Graph, base: str, data: np.ndarray) -> str:
    """Add a constant under a fresh name derived from ``base``; returns the name."""
    name = graph.unique_name(base)
    graph.add_const(name, data)
    return name


def new_value_name(graph: Graph, base: str) -> str:
    return graph.unique_name(base)


def unique_node_name(graph: Graph, base: str) -> str:
    names = {n.name for n in graph.nodes}
    if base not in names:
        return base
    i = 1
    while f"{base}_{i}" in names:
        i += 1
    return f"{base}_{i}"


def replace_uses(graph: Graph, old: str, new: str) -> None:
    """Every node input reading ``old`` reads ``new`` instead (graph outputs untouched)."""
    for n in graph.nodes:
        if old in n.inputs:
            n.inputs = [new if i == old else i for i in n.inputs]


def rename_value(graph: Graph, old: str, new: str) -> None:
    """Rename a node-produced value everywhere (``new`` must not exist yet)."""
    v = graph.values.pop(old)
    v.name = new
    graph.values[new] = v
    for n in graph.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
        n.outputs = [new if o == old else o for o in n.outputs]
    graph.outputs = [new if o == old else o for o in graph.outputs]


def bypass(graph: Graph, node: Node, src: str, dst: str) -> bool:
    """Make the readers of ``dst`` (an output of ``node``) read ``src`` and drop
    ``node``. When ``dst`` is a graph output, ``src`` takes over its name (if
    ``src`` is produced by a node and is not itself a graph input or output);
    a constant ``src`` is copied under that name. Returns False (graph
    unchanged) when the output name cannot be kept."""
    if dst in graph.outputs:
        if src in graph.outputs or src in graph.inputs:
            return False
        src_value = graph.values[src]
        if src_value.is_const:
            graph.nodes.remove(node)
            graph.values[dst].data = src_value.data
            graph.values[dst].dtype, graph.values[dst].shape = src_value.dtype, src_value.shape
            return True
        graph.nodes.remove(node)
        for n in graph.nodes:  # readers of dst now read src, which is then renamed dst
            n.inputs = [src if i == dst else i for i in n.inputs]
        del graph.values[dst]
        rename_value(graph, src, dst)
        return True
    graph.nodes.remove(node)
    replace_uses(graph, dst, src)
    graph.values.pop(dst, None)
    return True


def make_const(graph: Graph, node: Node, outputs: list) -> None:
    """Turn ``node`` into constants: its outputs keep their names, now holding data."""
    graph.nodes.remove(node)
    for name, data in zip(node.outputs, outputs):
        data = np.asarray(data)
        if not data.flags.c_contiguous:
            data = data.copy(order="C")
        from ..ir.dtypes import from_numpy

        v = graph.values[name]
        v.data, v.dtype, v.shape = data, from_numpy(data.dtype), tuple(data.shape)


def absorb_consumer(graph: Graph, node: Node, user: Node) -> None:
    """``node`` takes over the output of ``user``, its only consumer, which disappears
    with the value between them (fusing an activation or a bias-like Add)."""
    old = node.outputs[0]
    node.outputs = [user.outputs[0]]
    graph.nodes.remove(user)
    graph.values.pop(old, None)


def prune(graph: Graph) -> int:
    """Remove nodes none of whose outputs is read (nor a graph output), then
    constants and value entries nothing refers to. Returns the nodes removed."""
    removed = 0
    used = set(graph.outputs)
    keep = []
    for n in reversed(graph.nodes):
        if any(o in used for o in n.outputs if o):
            keep.append(n)
            used.update(i for i in n.inputs if i)
        else:
            removed += 1
    keep.reverse()
    graph.nodes = keep
    produced = {o for n in graph.nodes for o in n.outputs}
    alive = used_names(graph) | produced | set(graph.inputs)
    for name in [k for k in graph.values if k not in alive]:
        del graph.values[name]
    return removed


def refresh_shapes(graph: Graph) -> None:
    """Recompute every node output's recorded dtype and shape (after a rewrite)."""
    infer_shapes(graph)


def infer_outputs(graph: Graph, node: Node) -> list:
    """The TensorInfos the shape rule gives ``node`` from its inputs' recorded shapes."""
    from ..ops.registry import TensorInfo

    ins = []
    for name in node.inputs:
        if not name:
            ins.append(None)
            continue
        v = graph.values[name]
        ins.append(TensorInfo(v.dtype, tuple(v.shape), v.data))
    return infer_node(node, ins)
