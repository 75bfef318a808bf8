"""Scheduling under an SRAM budget: which layers run whole and which run as cascades.

A cascade is a run of consecutive operations executed stripe by stripe: each stripe of the
cascade's last output (``stripe`` rows) pulls, backwards through the cascade, exactly the
rows of every intermediate tensor it needs that are not computed yet, and those are
computed first. An intermediate tensor then lives in a rolling buffer of as many rows as
any one stripe needs at once (row r in slot r mod ring_rows), and only the cascade's inputs
and its output are whole tensors. Every row is computed once; what a cascade costs is the
weights read again per stripe, the halo rows read again and the overhead per command.

The choice is a dynamic programme over the schedule: a partition of the operations into
segments (a segment of one operation is that operation run whole), each segment with one
stripe height, fitting the budget at every command (the whole tensors that live across a
segment count against it), at the fewest estimated cycles. Among the programs within
``tolerance`` of the fewest cycles, the one with the smallest peak is kept.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from ..errors import NpuforgeError
from .cycles import command_cost
from .kernels import needed_rows
from .memplan import Buffer
from .weights import align

ROW_LOCAL = ("conv", "depthwise", "add", "sub", "mul", "lut", "avgpool", "maxpool", "concat", "resize_bilinear")
MAX_CASCADE = 24  # operations per cascade at most (longer ones seldom pay and cost search time)


@dataclass
class Command:
    op: int
    row0: int
    rows: int
    cycles: int = 0
    macs: int = 0
    sram_bytes: int = 0
    dram_bytes: int = 0
    compute: int = 0


@dataclass
class Segment:
    start: int  # index into the schedule
    stop: int  # exclusive
    stripe: int  # output rows per stripe (the output's height: run whole)
    commands: list
    rings: dict  # tensor id -> rows of its rolling buffer
    cycles: int
    peak: int  # bytes live at its busiest command, whole tensors living across it included
    own: int = 0  # the same without the whole tensors living across it (what the segment itself holds)


class Tiler:
    def __init__(self, lowered, target, dram_payload: list[int]):
        self.low = lowered
        self.tensors = lowered.tensors
        self.ops = lowered.ops
        self.target = target
        self.payload = dram_payload  # per op: weight + parameter bytes read from DRAM per command
        n = len(self.ops)
        self.producer = {op.output: i for i, op in enumerate(self.ops)}
        self.consumers: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            for t in set(op.inputs):
                self.consumers.setdefault(t, []).append(i)
        self.outputs = set(lowered.outputs)
        # position of the last op reading each tensor (graph outputs: past the end)
        self.last_use = {t: (n if t in self.outputs else max(c)) for t, c in self.consumers.items()}
        for t in self.outputs:
            self.last_use[t] = n
        self.first = {t: self.producer.get(t, -1) for t in range(len(self.tensors))}
        self._first = np.array([self.first[t] for t in range(len(self.tensors))])
        self._last = np.array([self.last_use.get(t, -1) for t in range(len(self.tensors))])
        self._readers = {t: sorted(c) for t, c in self.consumers.items()}
        self._segments: dict = {}
        self._touching: dict[int, set] = {}  # tensor -> keys of the cached segments that read or write it
        self._crossing: dict = {}

    def spill(self, tensors) -> None:
        """Move ``tensors`` to DRAM, forgetting what their SRAM sizes and traffic decided."""
        for t in tensors:
            self.tensors[t].dram = True
            for key in self._touching.pop(t, ()):
                self._segments.pop(key, None)
        self._crossing.clear()

    def size(self, t: int, rows: int | None = None) -> int:
        """SRAM bytes of tensor t (``rows`` of a rolling buffer); a spilled tensor takes none."""
        tensor = self.tensors[t]
        if tensor.dram:
            return 0
        return align((tensor.h if rows is None else rows) * tensor.row_bytes, self.target.alignment)

    # -- one segment ----------------------------------------------------------------------------
    def crossing(self, start: int, stop: int) -> int:
        """Bytes of whole tensors produced before ``start`` and read after ``stop`` - 1 (none of the
        segment's business, but live all through it)."""
        if (start, stop) in self._crossing:
            return self._crossing[start, stop]
        total = 0
        for t in np.flatnonzero((self._first < start) & (self._last >= stop)).tolist():
            readers = self._readers.get(t, [])
            k = bisect.bisect_left(readers, start)
            if k == len(readers) or readers[k] >= stop:  # none of the segment's ops reads it
                total += self.size(t)
        self._crossing[start, stop] = total
        return total

    def cascadable(self, start: int, stop: int) -> bool:
        """Row-local operations, and only the last one's output leaves the segment."""
        for i in range(start, stop):
            op = self.ops[i]
            if op.kind not in ROW_LOCAL:
                return False
            if i < stop - 1 and (op.output in self.outputs or self.last_use[op.output] >= stop or
                                 self.tensors[op.output].dram):  # a rolling buffer lives in SRAM
                return False
        return True

    def segment(self, start: int, stop: int, stripe: int) -> Segment:
        key = (start, stop, stripe)  # the budget search asks for the same segments again and again
        seg = self._segments.get(key)
        if seg is None:
            seg = self._segments[key] = self._segment(start, stop, stripe)
            for i in range(start, stop):
                for t in (*self.ops[i].inputs, self.ops[i].output):
                    self._touching.setdefault(t, set()).add(key)
        seg.peak = self.crossing(start, stop) + seg.own  # (crossing tensors may have been spilled since)
        return seg

    def _segment(self, start: int, stop: int, stripe: int) -> Segment:
        ops = self.ops
        last = ops[stop - 1]
        height = self.tensors[last.output].h
        internal = {ops[i].output for i in range(start, stop)}
        done = {t: 0 for t in internal}
        rings = {t: 0 for t in internal}
        commands = []
        for a in range(0, height, stripe):
            b = min(a + stripe, height)
            need = {last.output: (a, b)}
            produce = {}
            for i in range(stop - 1, start - 1, -1):
                op = ops[i]
                lo, hi = need.get(op.output, (0, 0))
                p0, p1 = done[op.output], max(done[op.output], hi)
                if op.output != last.output:  # what this stripe writes and what its readers still need
                    rings[op.output] = max(rings[op.output], p1 - min(p0, max(lo, 0)))
                if p1 <= p0:
                    continue
                produce[i] = (p0, p1)
                for k, t in enumerate(op.inputs):
                    src = self.tensors[t]
                    ilo, ihi = needed_rows(op.kind, op.params, p0, p1, src.h, k)
                    ilo, ihi = max(ilo, 0), min(ihi, src.h)
                    if t in internal and ihi > ilo:
                        old = need.get(t)
                        need[t] = (ilo, ihi) if old is None else (min(old[0], ilo), max(old[1], ihi))
            for i in range(start, stop):
                if i in produce:
                    p0, p1 = produce[i]
                    commands.append(Command(i, p0, p1 - p0))
                    done[ops[i].output] = p1
        for t in internal:
            if t != last.output and done[t] == 0:
                raise NpuforgeError(f"internal: tensor '{self.tensors[t].name}' of a cascade is never computed")
        for c in commands:
            cost = command_cost(ops[c.op], c.row0, c.rows, self.tensors, self.target, self.payload[c.op])
            c.cycles, c.macs, c.sram_bytes, c.dram_bytes, c.compute = \
                cost.cycles, cost.macs, cost.sram_bytes, cost.dram_bytes, cost.compute
        # at least one row, at most the whole tensor (a ring as tall as the tensor is a whole buffer)
        rings = {t: max(1, min(r, self.tensors[t].h)) for t, r in rings.items() if t != last.output}
        inputs = {t for i in range(start, stop) for t in ops[i].inputs if t not in internal}
        whole = sum(self.size(t) for t in inputs) + self.size(last.output)
        own = whole + sum(self.size(t, r) for t, r in rings.items())
        return Segment(start, stop, stripe, commands, rings, sum(c.cycles for c in commands), 0, own)

    # -- the whole schedule ------------------------------------------------------------------------
    def untiled(self) -> list[Segment]:
        if (0, 1) not in self._crossing:
            self._single_crossings()
        return [self.segment(i, i + 1, self.tensors[op.output].h) for i, op in enumerate(self.ops)]

    def _single_crossings(self) -> None:
        """crossing(i, i + 1) for every op at once: a tensor counts for the ops after its producer and
        before its last reader, except the ops that read it (one pass instead of one per op)."""
        n = len(self.ops)
        total = np.zeros(n + 1, np.int64)
        for t, last in self.last_use.items():
            first = self.first[t]
            if last - first >= 2:
                size = self.size(t)
                total[first + 1] += size
                total[last] -= size
                for i in self._readers.get(t, ()):
                    if first < i < last:
                        total[i] -= size
                        total[i + 1] += size
        for i, c in enumerate(np.cumsum(total)[:n].tolist()):
            self._crossing[i, i + 1] = c

    def _stripes(self, height: int) -> list[int]:
        s, out = 1, []
        while s < height:
            out.append(s)
            s *= 2
        return out

    def best(self, budget: int) -> list[Segment] | None:
        """The fewest-cycle partition whose every segment fits ``budget``; None if none does."""
        n = len(self.ops)
        base = self.untiled()
        inf = float("inf")
        cost = [0.0] + [inf] * n
        choice: list[Segment | None] = [None] * (n + 1)
        for stop in range(1, n + 1):
            if base[stop - 1].peak <= budget and cost[stop - 1] + base[stop - 1].cycles < cost[stop]:
                cost[stop], choice[stop] = cost[stop - 1] + base[stop - 1].cycles, base[stop - 1]
            for start in range(stop - 2, max(-1, stop - 1 - MAX_CASCADE), -1):
                if cost[start] == inf:
                    continue
                if not self.cascadable(start, stop):
                    break
                if all(base[i].peak <= budget for i in range(start, stop)):
                    continue  # runs whole within budget: cascading only adds cycles
                for stripe in self._stripes(self.tensors[self.ops[stop - 1].output].h):
                    seg = self.segment(start, stop, stripe)
                    if seg.peak <= budget and cost[start] + seg.cycles < cost[stop]:
                        cost[stop], choice[stop] = cost[start] + seg.cycles, seg
        # the first op no feasible partition reaches past (for the error when none fits)
        self.stuck = max(k for k in range(n + 1) if cost[k] < inf)
        self.reachable = [k for k in range(n + 1) if cost[k] < inf]
        if cost[n] == inf:
            return None
        segments, stop = [], n
        while stop > 0:
            segments.append(choice[stop])
            stop = choice[stop].start
        return segments[::-1]

    def least_peak(self, i: int) -> int:
        """The smallest peak found for op i: run whole, or in a cascade (1- or 2-row stripes)
        starting where the budget's partition could still start."""
        least = self.segment(i, i + 1, self.tensors[self.ops[i].output].h).peak
        for start in [k for k in getattr(self, "reachable", [i]) if i - MAX_CASCADE < k <= i]:
            for stop in range(i + 1, min(len(self.ops), start + MAX_CASCADE) + 1):
                if stop - start > 1 and self.cascadable(start, stop):
                    for stripe in self._stripes(self.tensors[self.ops[stop - 1].output].h)[:2]:
                        least = min(least, self.segment(start, stop, stripe).peak)
        return least


def buffers_of(tiler: Tiler, segments: list[Segment]) -> tuple[list[Command], list[Buffer]]:
    """The program's commands in order, and every buffer with its lifetime in command indices."""
    commands = [c for s in segments for c in s.commands]
    n = len(commands)
    first: dict[int, int] = {t: 0 for t in tiler.low.inputs}
    last: dict[int, int] = {t: n - 1 for t in tiler.low.outputs}
    ring_rows: dict[int, int] = {}
    for s in segments:
        ring_rows.update(s.rings)
    for k, c in enumerate(commands):
        op = tiler.ops[c.op]
        first.setdefault(op.output, k)
        last[op.output] = max(last.get(op.output, k), k)
        for t in op.inputs:
            last[t] = max(last.get(t, k), k)
    buffers = []
    for t in sorted(first):
        if tiler.tensors[t].dram:
            continue  # placed in DRAM by the compiler, not in the SRAM plan
        rows = ring_rows.get(t, tiler.tensors[t].h)
        buffers.append(Buffer(t, tiler.size(t, rows), first[t], last[t], rows))
    return commands, buffers
