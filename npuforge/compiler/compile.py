"""The compiler's driver: quantized IR -> NPU operations -> cascades under the SRAM budget ->
memory plan -> packed weights and parameter blocks -> the ``.npub`` bytes, with the cycle
estimate and the figures a report shows."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import NpuforgeError
from .binfmt import CommandRecord, TensorRecord, encode_params, read_program, write_program
from .lower import lower
from .memplan import liveness_bound, plan_memory
from .schedule import reorder, schedule
from .tiling import Tiler, buffers_of
from .weights import align, encode

TOLERANCE = 0.01  # a smaller peak is worth this much of the fewest cycles


@dataclass
class Program:
    target: object
    budget: int
    lowered: object
    segments: list
    commands: list
    buffers: list
    plan: dict
    weight_blocks: list  # per op: (offset, stored length, codec, count) or None
    data: bytes = b""
    stats: dict = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return self.plan["peak"]


def _pack(lowered, target):
    """Weight and parameter blocks of every op: (weights blob, params blob, per-op weight and
    parameter locations, per-op DRAM bytes read by one command)."""
    weights, params = bytearray(), bytearray()
    wblocks, pblocks, payload = [], [], []
    raw = padded = 0
    for op in lowered.ops:
        pb = encode_params(op.params, f"node '{op.name}'")
        pblocks.append((len(params), len(pb)))
        params += pb + b"\0" * ((-len(pb)) % 4)
        if op.weights is None:
            wblocks.append((0, 0, 0, 0))
            payload.append(len(pb))
            continue
        codec, blob = encode(op.weights)
        wblocks.append((len(weights), len(blob), codec, op.weights.size))
        weights += blob + b"\0" * ((-len(blob)) % target.alignment)
        raw += op.weights.size
        padded += align(op.weights.size, target.alignment)
        payload.append(len(blob) + len(pb))
    return bytes(weights), bytes(params), wblocks, pblocks, payload, raw, padded


def _fit(tiler, budget: int):
    """The fewest-cycle schedule under the SRAM budget, with tensors spilled to DRAM one at a time
    (the largest whole tensor the first op no schedule reaches holds, reads or keeps alive) until one
    fits; a spilled tensor takes no SRAM and moves at DRAM's rate."""
    lowered = tiler.low
    while True:
        segments = tiler.best(budget)
        if segments is not None:
            return segments
        i = tiler.stuck
        op = lowered.ops[i]
        around = [*op.inputs, op.output] + [t for t in range(len(lowered.tensors)) if t in tiler.last_use and
                                              tiler.first[t] < i and tiler.last_use[t] > i]
        candidates = [t for t in dict.fromkeys(around) if not lowered.tensors[t].dram]
        if not candidates:  # everything it touches is in DRAM already: no SRAM can run it
            raise NpuforgeError(f"node '{op.name}' does not fit {budget} bytes of SRAM even with its tensors in "
                                f"DRAM; raise --sram or use a target with more SRAM")
        # the largest first, as many as the op's smallest schedule is over the budget (each search is
        # a whole dynamic programme: one spill per search made DenseNet-121 take 16 s)
        over = tiler.least_peak(i) - budget
        spilled = []
        for t in sorted(candidates, key=lambda k: (-lowered.tensors[k].nbytes, k)):
            over -= tiler.size(t)
            spilled.append(t)
            if over <= 0:
                break
        tiler.spill(spilled)


def _smallest_peak(tiler, segments, tolerance: float, alignment: int):
    """Among the programs within ``tolerance`` of the fewest cycles, the one with the smallest peak
    (bisection on the budget)."""
    fewest = sum(s.cycles for s in segments)
    lo, hi = 0, max(s.peak for s in segments)
    for _ in range(12 if tolerance > 0 else 0):
        if hi - lo <= alignment * 64:
            break
        mid = (lo + hi) // 2
        trial = tiler.best(mid)
        if trial is not None and sum(s.cycles for s in trial) <= fewest * (1 + tolerance):
            segments, hi = trial, max(s.peak for s in trial)
        else:
            lo = mid
    return segments


def device_stats(lowered, commands) -> dict:
    """Where the work runs: the NPU's share of the MACs, and the IR ops left to the host CPU."""
    macs = {"npu": 0, "cpu": 0}
    for c in commands:
        macs["cpu" if lowered.ops[c.op].kind == "cpu" else "npu"] += c.macs
    cpu_ops: dict = {}
    for op in lowered.ops:
        if op.kind == "cpu":
            cpu_ops[op.ir_op] = cpu_ops.get(op.ir_op, 0) + 1
    total = macs["npu"] + macs["cpu"]
    return {"npu_macs_fraction": round(macs["npu"] / total, 6) if total else 1.0, "cpu_macs": macs["cpu"],
            "cpu_commands": sum(1 for c in commands if lowered.ops[c.op].kind == "cpu"),
            "cpu_ops": dict(sorted(cpu_ops.items(), key=lambda kv: (-kv[1], kv[0])))}


def compile_graph(graph, target, sram: int | None = None, tolerance: float = TOLERANCE) -> Program:
    t0 = time.perf_counter()
    budget = int(sram if sram is not None else target.sram_bytes)
    lowered = lower(graph, target)
    order, order_bounds = schedule(lowered)
    reorder(lowered, order)
    wblob, pblob, wblocks, pblocks, payload, raw, padded = _pack(lowered, target)
    # a schedule's liveness bound may fit where no placement of its buffers does (fragmentation):
    # then schedule again under a budget lowered by the overshoot, spilling more where needed
    schedule_budget = budget
    tiler = Tiler(lowered, target, payload)
    while True:
        segments = _fit(tiler, schedule_budget)
        if not any(t.dram for t in lowered.tensors):  # with spills the budget binds: no smaller peak to trade for
            segments = _smallest_peak(tiler, segments, tolerance, target.alignment)
        commands, buffers = buffers_of(tiler, segments)
        plan = plan_memory(buffers, len(commands), target.alignment)
        if plan["peak"] <= budget:
            break
        schedule_budget -= plan["peak"] - budget + target.alignment
    spilled = [k for k, t in enumerate(lowered.tensors) if t.dram]
    untiled = tiler.untiled()
    whole_cmds, whole_bufs = buffers_of(tiler, untiled)
    program = Program(target, budget, lowered, segments, commands, buffers, plan, wblocks)
    offsets = {b.tensor: (b.offset, b.ring_rows) for b in buffers}
    dram = 0
    for k in spilled:  # one after another in DRAM, each whole, aligned
        offsets[k] = (dram, lowered.tensors[k].h)
        dram = align(dram + lowered.tensors[k].nbytes, target.alignment)
    tensors = [TensorRecord(t.name, t.dtype, t.h, t.w, t.c, *offsets.get(k, (0, t.h)), t.scale, t.zero_point,
                            int(t.dram)) for k, t in enumerate(lowered.tensors)]
    records = []
    for c in commands:
        op = lowered.ops[c.op]
        records.append(CommandRecord(op.kind, c.op, c.row0, c.rows, pblocks[c.op], wblocks[c.op],
                                     (op.output, offsets[op.output][0]), [(t, offsets[t][0]) for t in op.inputs]))
    io_in = [(t, lowered.tensors[t].nchw) for t in lowered.inputs]
    io_out = [(t, lowered.tensors[t].nchw) for t in lowered.outputs]
    program.stats = {
        "model": graph.name,
        "target": target.name,
        "sram_budget": budget,
        "peak_sram": plan["peak"],
        "liveness_bound": plan["bound"],
        "plan_order": plan["order"],
        "schedule": order_bounds["chosen"],
        "untiled_liveness_bound": liveness_bound(whole_bufs, len(whole_cmds)),
        "no_reuse_bytes": sum(b.size for b in whole_bufs),
        "cycles": sum(c.cycles for c in commands),
        "untiled_cycles": sum(s.cycles for s in untiled),
        "milliseconds": sum(c.cycles for c in commands) / (target.clock_mhz * 1e3),
        "macs": sum(c.macs for c in commands),
        "dram_bytes": sum(c.dram_bytes for c in commands),
        "sram_traffic_bytes": sum(c.sram_bytes for c in commands),
        "weight_bytes_raw": raw,
        "weight_bytes_padded": padded,
        "weight_bytes_stored": sum(b[1] for b in wblocks),
        "operations": len(lowered.ops),
        "commands": len(commands),
        **device_stats(lowered, commands),
        "spilled_bytes": sum(lowered.tensors[k].nbytes for k in spilled),
        "spilled_tensors": [lowered.tensors[k].name for k in spilled],
        "cascades": [{"first": lowered.ops[s.start].name, "last": lowered.ops[s.stop - 1].name,
                      "operations": s.stop - s.start, "stripe_rows": s.stripe} for s in segments if s.stop - s.start > 1],
    }
    meta = {"npuforge": "compiled program", "stats": program.stats, "target": target.to_dict(),
            "preprocess": graph.metadata.get("preprocess"), "ops": [op.name for op in lowered.ops]}
    program.data = write_program(tensors, records, io_in, io_out, pblob, wblob, meta)
    # read back through every check `npuforge run` makes: never write a program the reader refuses
    read_program(program.data, f"the program compiled from '{graph.name}'")
    program.stats["compile_seconds"] = round(time.perf_counter() - t0, 3)
    return program
