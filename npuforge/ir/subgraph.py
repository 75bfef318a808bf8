"""Cutting a graph after its first nodes, so that an evaluation can start from values
an earlier run computed (``analyze`` reuses the unchanged prefix of a network), or run the
two parts on different engines (the integer simulator's lowered head and plain tail)."""

from __future__ import annotations

import numpy as np

from .graph import Graph


def live_values(graph: Graph, start: int) -> list[str]:
    """The values that nodes ``start`` onward (or the graph's outputs) read but that nodes
    before ``start`` (or the graph's inputs) produce: what a run from node ``start`` needs, in
    the order they are first read."""
    made = set(graph.inputs) | {y for node in graph.nodes[:start] for y in node.outputs if y}
    needed = [name for node in graph.nodes[start:] for name in node.inputs] + list(graph.outputs)
    out, seen = [], set()
    for name in needed:
        if name and name in made and name not in seen and not graph.values[name].is_const:
            seen.add(name)
            out.append(name)
    return out


def values_bytes(graph: Graph, names: list[str], rows: int, itemsize: int) -> int | None:
    """Bytes the values ``names`` take over ``rows`` entries of their first (batch) axis at
    ``itemsize`` bytes an element; None when one's other dimensions are not known."""
    size = 0
    for name in names:
        shape = graph.values[name].shape
        if shape is None or not all(isinstance(d, int) for d in shape[1:]):
            return None
        size += rows * int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    return size


def suffix(graph: Graph, start: int) -> Graph:
    """The graph from node ``start`` on, its inputs the :func:`live_values` there. It shares
    its nodes and values with ``graph`` (read it, do not change it)."""
    sub = Graph(graph.name)
    sub.inputs, sub.outputs = live_values(graph, start), list(graph.outputs)
    sub.nodes, sub.values, sub.metadata = graph.nodes[start:], graph.values, graph.metadata
    return sub


def prefix(graph: Graph, stop: int) -> Graph:
    """The graph of the nodes before ``stop``: its inputs the graph's inputs they read, its outputs
    the values they make that :func:`suffix` (``stop``) reads. Shares nodes and values."""
    sub = Graph(graph.name)
    read = {name for node in graph.nodes[:stop] for name in node.inputs if name}
    sub.inputs = [name for name in graph.inputs if name in read]
    sub.outputs = [name for name in live_values(graph, stop) if name not in graph.inputs]
    sub.nodes, sub.values, sub.metadata = graph.nodes[:stop], graph.values, graph.metadata
    return sub


def with_outputs(graph: Graph, extra: list[str]) -> Graph:
    """``graph`` also giving the values ``extra`` as outputs (sharing nodes and values)."""
    out = Graph(graph.name)
    out.inputs, out.nodes, out.values, out.metadata = list(graph.inputs), graph.nodes, graph.values, graph.metadata
    out.outputs = list(graph.outputs) + [n for n in extra if n not in graph.outputs]
    return out
