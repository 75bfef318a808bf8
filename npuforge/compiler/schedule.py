"""The order of operations: graph order, or a memory-greedy topological order where that
needs less SRAM with whole tensors.

On a chain (with residuals) there is one sensible order; on a branchy graph the order decides
which branch's tensors are alive together. The greedy order runs, among the operations whose
inputs are ready, the one that leaves the fewest bytes live (its output, minus the inputs it
reads for the last time), ties in graph order. Each order's liveness bound is computed and the
smaller kept, so the result is never worse than graph order.
"""

from __future__ import annotations

import heapq


def _bound(ops, tensors, order, inputs, outputs) -> int:
    last = {}
    for pos, i in enumerate(order):
        for t in ops[i].inputs:
            last[t] = pos
    live = sum(tensors[t].nbytes for t in inputs)
    peak = live
    for pos, i in enumerate(order):
        op = ops[i]
        live += tensors[op.output].nbytes
        peak = max(peak, live)
        for t in set(op.inputs):
            if last.get(t) == pos and t not in outputs:
                live -= tensors[t].nbytes
        if op.output not in last and op.output not in outputs:
            live -= tensors[op.output].nbytes
    return peak


def greedy_order(ops, tensors, inputs) -> list[int]:
    producer = {op.output: i for i, op in enumerate(ops)}
    waiting = {i: {t for t in op.inputs if t in producer} for i, op in enumerate(ops)}
    readers: dict[int, set] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            readers.setdefault(t, set()).add(i)
    done: set = set()

    def gain(i):  # bytes live after running op i, relative to before
        freed = sum(tensors[t].nbytes for t in set(ops[i].inputs) if readers[t] - done == {i})
        return tensors[ops[i].output].nbytes - freed

    ready = [(gain(i), i) for i, w in waiting.items() if not w]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        if i in done:
            continue
        order.append(i)
        done.add(i)
        for j in readers.get(ops[i].output, ()):
            waiting[j].discard(ops[i].output)
            if not waiting[j]:
                heapq.heappush(ready, (gain(j), j))
        # the gains of ready ops change as readers finish: refresh them
        ready = [(gain(j), j) for _, j in ready if j not in done]
        heapq.heapify(ready)
    return order


def schedule(lowered) -> tuple[list[int], dict]:
    """(order of op indices, {"graph": bound, "greedy": bound, "chosen": name})."""
    ops, tensors = lowered.ops, lowered.tensors
    graph = list(range(len(ops)))
    greedy = greedy_order(ops, tensors, lowered.inputs)
    if sorted(greedy) != graph:  # pragma: no cover - every op becomes ready in a topological graph
        raise AssertionError("greedy schedule lost operations")
    outputs = set(lowered.outputs)
    bounds = {"graph": _bound(ops, tensors, graph, lowered.inputs, outputs),
              "greedy": _bound(ops, tensors, greedy, lowered.inputs, outputs)}
    chosen = "greedy" if bounds["greedy"] < bounds["graph"] else "graph"
    return (greedy if chosen == "greedy" else graph), {**bounds, "chosen": chosen}


def reorder(lowered, order: list[int]) -> None:
    lowered.ops = [lowered.ops[i] for i in order]
