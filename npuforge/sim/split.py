"""The integer program on two engines: ONNX Runtime's lowering up to the first node it has
no lowering for, the plain simulator from there on.

A detector's NonMaxSuppression, or a node that ``auto`` will not run in float, usually sits
near the end; everything before it (the network) then runs lowered, and the codes it hands
on are the plain path's, so the result is too."""

from __future__ import annotations

import numpy as np

from ..errors import NpuforgeError, UnsupportedError
from ..ir.subgraph import prefix, suffix
from .integer import IntegerSimulator

ATTEMPTS = 3  # heads tried, each ending where the one before was refused


class SplitSimulator:
    """``SplitSimulator(graph, stop, rounding, float_nodes, why).run(feeds)``: the same results as
    :class:`~npuforge.sim.integer.IntegerSimulator` (up to float summation order in nodes kept in
    float, as :class:`~npuforge.sim.lowered.LoweredSimulator` with ``float_nodes``), nodes before
    ``stop`` lowered, the rest plain. ``plain_from``: why the plain part starts where it does (the
    refusal of its first node, which it names)."""

    def __init__(self, graph, stop: int, rounding: str, float_nodes: bool, why: str):
        from .lowered import LoweredSimulator

        self.graph, self.rounding = graph, rounding
        self.head = LoweredSimulator(prefix(graph, stop), rounding, float_nodes=float_nodes)
        self.tail = IntegerSimulator(suffix(graph, stop), rounding)
        self.plain_from = why
        self.lowering = {**self.head.lowering, **{n.name: "plain simulator" for n in self.tail.graph.nodes}}
        self._plain: IntegerSimulator | None = None

    def run(self, feeds: dict, outputs: list[str] | None = None, dequantize: bool = True) -> dict:
        wanted = list(outputs or self.graph.outputs)
        if any(name not in self.graph.outputs for name in wanted):  # an inner value: the plain path has all
            self._plain = self._plain or IntegerSimulator(self.graph, self.rounding)
            return self._plain.run(feeds, wanted, dequantize)
        names = self.graph.inputs
        for name in sorted(set(feeds) - set(names)) + [n for n in names if n not in feeds]:
            raise NpuforgeError(f"{'unknown input' if name in feeds else 'missing input'} '{name}'; the graph's "
                                f"inputs are: {', '.join(names)}")
        head = self.head.graph
        codes = self.head.run({n: feeds[n] for n in head.inputs}, head.outputs, dequantize=False) \
            if head.outputs else {}
        return self.tail.run({n: codes[n] if n in codes else np.asarray(feeds[n]) for n in self.tail.graph.inputs},
                             wanted, dequantize)


def split_simulator(graph, rounding: str, float_nodes: bool, refusal: UnsupportedError) -> SplitSimulator | None:
    """A :class:`SplitSimulator` whose plain part starts at the node ``refusal`` names (or where its
    head was refused in turn), or None when none has a node before it to lower."""
    stop, why = getattr(refusal, "node_index", 0), str(refusal)
    for _ in range(ATTEMPTS):
        if stop < 1:
            return None
        try:
            return SplitSimulator(graph, stop, rounding, float_nodes, why)
        except UnsupportedError as e:
            stop, why = min(getattr(e, "node_index", 0), stop - 1), str(e)
    return None
