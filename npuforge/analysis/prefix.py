"""Starting a quantized variant's integer program where it first differs from the base.

``analyze`` scores many variants of one quantized graph, each changing a few layers
(one kept in float, one in int16, another observer). Every node before the first
changed one computes the same codes as in the base program, so the codes of the values
that cross that point are kept from the first run that computes them, and a later
variant that changes nothing before that point runs only from there on."""

from __future__ import annotations

import hashlib

import numpy as np

from ..ir.subgraph import live_values, values_bytes

BUDGET = 1 << 30  # bytes of kept codes (one byte each)
SHORTEST = 0.1  # a prefix worth keeping holds at least this share of the nodes


def node_digests(graph) -> list[str]:
    """Per node, a digest of all that decides its output codes given its input codes: the node,
    its integer constants, its constant inputs and the parameters of every value it reads or
    writes."""
    def value(h, name):
        v = graph.values[name]
        q = v.quant
        data = np.ascontiguousarray(v.data) if v.is_const else None
        h.update(repr((name, v.dtype, v.shape, None if q is None else (q.dtype, q.axis, np.shape(q.scale)),
                       None if data is None else data.dtype.str)).encode())
        if q is not None:
            h.update(np.asarray(q.scale).tobytes())
            h.update(np.asarray(q.zero_point).tobytes())
        if data is not None:  # the bytes themselves: their repr would cost seconds per evaluation on a large model
            h.update(data.tobytes())

    out = []
    for node in graph.nodes:
        h = hashlib.sha256(repr((node.op, node.inputs, node.outputs, sorted(node.attrs.items()),
                                 sorted(node.quant.items()))).encode())
        for name in [*node.inputs, *node.outputs, *node.quant.values()]:
            if name and name in graph.values:
                value(h, name)
        out.append(h.hexdigest())
    return out


def _params(graph, name: str) -> str:
    q = graph.values[name].quant
    return repr((q.dtype, q.axis, np.asarray(q.scale).tobytes(), np.asarray(q.zero_point).tobytes()))


class PrefixCache:
    """The codes of values at the points where variants first left the base program."""

    def __init__(self, budget: int = BUDGET):
        self.budget = budget
        self.base: list[str] | None = None  # node digests of the first program scored
        self.kept: dict[int, dict] = {}  # start node -> {value: (its parameters, codes over every image)}
        self.size = 0

    def start(self, graph) -> tuple[int, dict | None]:
        """(where ``graph`` first leaves the first program scored, None), or (an earlier node, the
        codes to start from there): kept at that node, for every value ``graph`` reads from it on,
        with the parameters ``graph`` gives them. The first graph is the base: (0, None)."""
        digests = node_digests(graph)
        if self.base is None:
            self.base = digests
            return 0, None
        first = next((i for i, (a, b) in enumerate(zip(digests, self.base)) if a != b), min(len(digests),
                                                                                            len(self.base)))
        for i in sorted((i for i in self.kept if i <= first), reverse=True):
            codes = self.kept[i]
            names = live_values(graph, i)
            if all(n in codes and codes[n][0] == _params(graph, n) for n in names):
                return i, {n: codes[n][1] for n in names}
        return first, None

    def worth_keeping(self, graph, first: int, images: int) -> list[str] | None:
        """The values to keep for starting at node ``first`` (8-bit per-tensor codes within the
        budget, after a prefix long enough to matter, not kept already), or None."""
        if first < SHORTEST * len(graph.nodes) or first in self.kept:
            return None
        names = live_values(graph, first)
        quants = [graph.values[n].quant for n in names]
        if any(q is None or q.dtype not in ("uint8", "int8") or q.per_channel for q in quants):
            return None
        size = values_bytes(graph, names, images, 1)
        return names if size is not None and self.size + size <= self.budget else None

    def keep(self, graph, first: int, codes: dict) -> None:
        """Keep ``codes`` ({value: array}) of ``graph`` to start later variants at node ``first``."""
        self.kept[first] = {n: (_params(graph, n), a) for n, a in codes.items()}
        self.size += sum(a.nbytes for a in codes.values())
