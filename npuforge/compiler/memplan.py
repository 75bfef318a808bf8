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


def _place(order: list[Buffer], alignment: int) -> tuple[int, list[int]]:
    placed: list[tuple[int, int, Buffer]] = []  # (offset, end, buffer)
    offsets = []
    peak = 0
    for b in order:
        clashes = sorted((o, e) for o, e, other in placed if other.first <= b.last and b.first <= other.last)
        offset = 0
        for o, e in clashes:
            if o - offset >= b.size:
                break
            offset = max(offset, -(-e // alignment) * alignment)
        placed.append((offset, offset + b.size, b))
        offsets.append(offset)
        peak = max(peak, offset + b.size)
    return peak, offsets


def plan_memory(buffers: list[Buffer], n_commands: int, alignment: int, seed: int = 0,
                climb_steps: int = 400) -> dict:
    """Set every buffer's offset; returns {"peak", "bound", "order"}."""
    bound = liveness_bound(buffers, n_commands)
    if not buffers:
        return {"peak": 0, "bound": 0, "order": "empty"}
    orders = {
        "size": sorted(buffers, key=lambda b: (-b.size, b.first)),
        "size x lifetime": sorted(buffers, key=lambda b: (-b.size * (b.last - b.first + 1), b.first)),
        "first use": sorted(buffers, key=lambda b: (b.first, -b.size)),
        "lifetime": sorted(buffers, key=lambda b: (-(b.last - b.first), -b.size)),
    }
    best_name, best_order, best = None, None, None
    for name, order in orders.items():
        peak, offsets = _place(order, alignment)
        if best is None or peak < best[0]:
            best_name, best_order, best = name, order, (peak, offsets)
        if peak <= bound:
            break
    if best[0] > bound:  # hill climbing on the best order
        rng = random.Random(seed)
        order = list(best_order)
        for _ in range(climb_steps):
            i, j = rng.randrange(len(order)), rng.randrange(len(order))
            if i == j:
                continue
            order[i], order[j] = order[j], order[i]
            peak, offsets = _place(order, alignment)
            if peak <= best[0]:
                if peak < best[0]:
                    best_name = f"{best_name} + hill climbing"
                best, best_order = (peak, offsets), list(order)
                if peak <= bound:
                    break
            else:
                order[i], order[j] = order[j], order[i]
    for b, offset in zip(best_order, best[1]):
        b.offset = offset
    return {"peak": best[0], "bound": bound, "order": best_name}
