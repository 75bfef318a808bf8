"""The SRAM plan: an offset for every buffer so that no two buffers live at the same time
overlap, as small a peak as the schedule allows.

A buffer lives from the first command that writes it to the last that reads it (graph
inputs from the start, graph outputs to the end). The liveness lower bound is the most
bytes live at any one command: no plan can be smaller. The planner places buffers greedily
(TFLite Micro's GreedyMemoryPlanner: largest first, each at the lowest offset where it
overlaps nothing live at the same time), tries a few other greedy orders, then improves the
best order by hill climbing (swap two buffers' places in the order, keep the swap when the
peak does not grow), as Vela does, and stops as soon as a plan reaches the bound.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Buffer:
    tensor: int
    size: int  # bytes, aligned
    first: int  # command index, inclusive
    last: int
    ring_rows: int  # rows held: the tensor's height for a whole tensor
    offset: int = -1


def liveness_bound(buffers: list[Buffer], n_commands: int) -> int:
    delta = [0] * (n_commands + 2)
    for b in buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def _overlaps(buffers: list[Buffer]) -> dict:
    """id(buffer) -> the buffers whose lifetimes meet its own (computed once per plan: placing is the
    inner loop of the hill climbing)."""
    by_first = sorted(buffers, key=lambda b: b.first)
    out = {id(b): [] for b in buffers}
    for i, b in enumerate(by_first):
        for other in by_first[i + 1:]:
            if other.first > b.last:
                break
            out[id(b)].append(other)
            out[id(other)].append(b)
    return out


def _place(order: list[Buffer], alignment: int, overlaps: dict | None = None) -> tuple[int, list[int]]:
    overlaps = overlaps if overlaps is not None else _overlaps(order)
    where: dict = {}  # id(buffer) -> (offset, end) once placed
    offsets = []
    peak = 0
    for b in order:
        clashes = sorted(where[id(o)] for o in overlaps[id(b)] if id(o) in where)
        offset = 0
        for o, e in clashes:
            if o - offset >= b.size:
                break
            offset = max(offset, -(-e // alignment) * alignment)
        where[id(b)] = (offset, offset + b.size)
        offsets.append(offset)
        peak = max(peak, offset + b.size)
    return peak, offsets


def plan_memory(buffers: list[Buffer], n_commands: int, alignment: int, seed: int = 0,
                climb_steps: int = 400, patience: int = 100) -> dict:
    """Set every buffer's offset; returns {"peak", "bound", "order"}. The hill climbing stops at the
    bound, after ``climb_steps`` swaps, or after ``patience`` swaps in a row that lowered nothing."""
    bound = liveness_bound(buffers, n_commands)
    if not buffers:
        return {"peak": 0, "bound": 0, "order": "empty"}
    orders = {
        "size": sorted(buffers, key=lambda b: (-b.size, b.first)),
        "size x lifetime": sorted(buffers, key=lambda b: (-b.size * (b.last - b.first + 1), b.first)),
        "first use": sorted(buffers, key=lambda b: (b.first, -b.size)),
        "lifetime": sorted(buffers, key=lambda b: (-(b.last - b.first), -b.size)),
    }
    overlaps = _overlaps(buffers)
    best_name, best_order, best = None, None, None
    for name, order in orders.items():
        peak, offsets = _place(order, alignment, overlaps)
        if best is None or peak < best[0]:
            best_name, best_order, best = name, order, (peak, offsets)
        if peak <= bound:
            break
    if best[0] > bound:  # hill climbing on the best order
        rng = random.Random(seed)
        order = list(best_order)
        stale = 0
        for _ in range(climb_steps):
            if stale >= patience:
                break
            stale += 1
            i, j = rng.randrange(len(order)), rng.randrange(len(order))
            if i == j:
                continue
            order[i], order[j] = order[j], order[i]
            peak, offsets = _place(order, alignment, overlaps)
            if peak <= best[0]:
                if peak < best[0]:
                    best_name = f"{best_name} + hill climbing"
                    stale = 0
                best, best_order = (peak, offsets), list(order)
                if peak <= bound:
                    break
            else:
                order[i], order[j] = order[j], order[i]
    for b, offset in zip(best_order, best[1]):
        b.offset = offset
    return {"peak": best[0], "bound": bound, "order": best_name}
