"""The cycle model: per command, the larger of its compute cycles and its transfer cycles,
plus the target's fixed overhead per command.

* compute: the MAC array covers ``mac_block = (ob, ib)`` output x input channels per cycle,
  so a convolution costs ``out_pixels x group x ceil(Cout_g / ob) x ceil(Cin_g / ib) x KH x KW``
  cycles (channel counts padded to the block: small layers use the array partly); a
  depthwise layer spreads its kernel taps over the ib lanes, ``out_pixels x ceil(C / ob) x
  ceil(KH KW / ib)``; a fully connected layer ``ceil(N / ob) x ceil(K / ib)``; elementwise,
  lookup, pooling and copies move ``elementwise_per_cycle`` elements (window taps count).
* transfer: SRAM bytes read and written (the stripe's input rows, halo included, and its
  output rows) at ``sram_bytes_per_cycle``; DRAM bytes (the command's weights as stored and
  its parameter block, rounded up to whole bursts) at ``dram_bytes_per_cycle`` after
  ``dram_latency_cycles``. The two memories and the MAC array run concurrently (weights are
  prefetched while the previous command computes), hence the maximum.

A striped layer reads its weights once per stripe: that, the halo rows read again and the
per-command overhead are what cascading costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .binfmt import NODE_OPCODES
from .kernels import needed_rows


@dataclass
class CommandCost:
    macs: int
    compute: int
    sram_bytes: int
    dram_bytes: int
    cycles: int


# passes over its elements a node command's NPU class makes (reads, a reduction, the write)
PASSES = {"softmax": 3, "normalization": 3, "reduce": 1, "gather": 1, "transpose": 1, "slice": 1, "pad": 1,
          "elementwise": 1}


def node_cost(op, tensors, target, dram_payload: int) -> CommandCost:
    """A node command (whole tensors): on the host CPU at the target's CPU rates plus the hand-over,
    or on the NPU (a matrix product on the MAC array, the other classes at the elementwise rate)."""
    elements = sum(tensors[t].h * tensors[t].w * tensors[t].c for t in [*op.inputs, op.output])
    moved = [(tensors[t].h * tensors[t].row_bytes, tensors[t].dram) for t in [*op.inputs, op.output]]
    sram = sum(n for n, dram in moved if not dram)
    dram_payload += sum(n for n, dram in moved if dram)  # a spilled tensor moves at DRAM's rate
    if op.kind == "cpu":
        compute = math.ceil(op.macs * target.cpu_cycles_per_mac + elements * target.cpu_cycles_per_element)
        return CommandCost(op.macs, compute, sram, dram_payload, compute + target.cpu_command_cycles)
    if op.kind == "matmul":
        compute = math.ceil(op.macs / target.macs_per_cycle)
    else:
        compute = math.ceil(elements * PASSES.get(op.kind, 1) / target.elementwise_per_cycle)
    burst = target.dram_burst_bytes
    dram = math.ceil(dram_payload / burst) * burst
    transfer_dram = target.dram_latency_cycles + math.ceil(dram / target.dram_bytes_per_cycle) if dram else 0
    cycles = max(compute, math.ceil(sram / target.sram_bytes_per_cycle), transfer_dram)
    return CommandCost(op.macs, compute, sram, dram, cycles + target.command_overhead_cycles)


def command_cost(op, row0: int, rows: int, tensors, target, dram_payload: int) -> CommandCost:
    if op.kind in NODE_OPCODES:
        return node_cost(op, tensors, target, dram_payload)
    out = tensors[op.output]
    p = op.params
    ob, ib = target.mac_block
    pixels = rows * out.w
    macs = 0
    if op.kind == "conv":
        group = p["group"]
        cout, kh, kw, cg = op.weights.shape
        og = cout // group
        macs = pixels * cout * cg * kh * kw
        compute = pixels * group * math.ceil(og / ob) * math.ceil(cg / ib) * kh * kw
    elif op.kind == "depthwise":
        kh, kw, c = op.weights.shape
        macs = pixels * c * kh * kw
        compute = pixels * math.ceil(c / ob) * math.ceil(kh * kw / ib)
    elif op.kind == "fully_connected":
        n, k = op.weights.shape
        macs = n * k
        compute = math.ceil(n / ob) * math.ceil(k / ib)
    else:
        taps = p.get("kernel_h", 1) * p.get("kernel_w", 1)
        elements = pixels * out.c * taps
        if op.kind == "global_avgpool":
            src = tensors[op.inputs[0]]
            elements = src.h * src.w * src.c
        compute = math.ceil(elements / target.elementwise_per_cycle)
    moved = [(rows * out.row_bytes, out.dram)]
    for k, t in enumerate(op.inputs):
        src = tensors[t]
        lo, hi = needed_rows(op.kind, p, row0, row0 + rows, src.h, k)
        moved.append(((min(hi, src.h) - max(lo, 0)) * src.row_bytes, src.dram))
    sram = sum(n for n, dram in moved if not dram)
    dram_payload += sum(n for n, dram in moved if dram)  # a spilled tensor's rows move at DRAM's rate
    burst = target.dram_burst_bytes
    dram = math.ceil(dram_payload / burst) * burst
    transfer_sram = math.ceil(sram / target.sram_bytes_per_cycle)
    transfer_dram = target.dram_latency_cycles + math.ceil(dram / target.dram_bytes_per_cycle) if dram else 0
    cycles = max(compute, transfer_sram, transfer_dram) + target.command_overhead_cycles
    return CommandCost(macs, compute, sram, dram, cycles)
