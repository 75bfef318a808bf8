"""int16 values as TFLite's 16x8 mode (int16 activations, int8 weights), under ``target='tflite'``.

The quantizer makes int16 the values of a sharing group it widens (a Concat of far-apart ranges,
a detector's box path, ``int16=`` names). TFLite writes such a group when LiteRT's 16x8 kernels
compute what the simulator computes, measured against its reference kernels
(tests/test_tflite_export_ops.py):

* a Conv / Gemm / MatMul by a constant with an int8 input and an int16 output: the export widens
  the input exactly (QUANTIZE int8 -> int16 on the grid ``s_x / 128``, zero point 0: each code
  times 128), and LiteRT's 16x8 convolution accumulates in int64 and requantizes with its 64-bit
  ``MultiplyByQuantizedMultiplier``: the multiplier rounded to its high 16 bits, one rounding.
  The quantizer stores that program: ``(M + 2^15) >> 16 << 16`` with ``single_rounding``
  (:func:`multiplier_16x8`), which is the same integer function of the int8 accumulator;
* a table op (Sigmoid, Tanh, ...) with an int8 input and an int16 output: its 256-entry table
  (GATHER, exact by construction);
* Concat and the ops that move codes (Reshape, Flatten, Transpose, Slice, ...) among int16 values;
* a table op reading an int16 value (a 65536-entry table, GATHER);
* Add / Sub / Mul whose output and activation inputs are all int16 (a constant operand is written
  as int16 codes ``c - zp``, zero point 0: the same products and sums). LiteRT's int16 MUL is its
  int8 arithmetic; its int16 ADD / SUB (general scales, ``pot_scale_int16`` false) shift the
  operands by 15 bits instead of 20 (:func:`add_multipliers_16`);
* graph outputs (int16 in the file), and nodes kept in float (they read the value dequantized: a
  detector's float NonMaxSuppression after its int16 boxes).

A widened group with any other producer or reader (an int16 input to a convolution, an Add of an
int8 and an int16 value, a MEAN: no 16x8 kernel computes npuforge's integers there) stays in
8 bits, and the log says so.
"""

from __future__ import annotations

import numpy as np

from .requant import quantize_multiplier

WIDE_PRODUCERS = ("compute", "lut", "concat", "passthrough")  # quantization kinds whose int16 output is written
WIDE_READERS = ("concat", "passthrough")  # kinds that may read an int16 value (code moves)
WIDENING_BITS = 7  # an int8 code minus its zero point, times 2^7, is an int16 code (|x - zp| <= 255)
ADD_LEFT_SHIFT_16 = 15  # LiteRT's int16 ADD / SUB shift their operands by 15 bits (int8: 20)


def multiplier_16x8(real) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, shift) whose single-rounding requantization is LiteRT's 16x8 one: TFLite's
    QuantizeMultiplier, then the multiplier rounded to its high 16 bits (kept at bit 31)."""
    m, s = quantize_multiplier(np.atleast_1d(np.asarray(real, np.float64)))
    m = m.astype(np.int64)
    high = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    return (high << 16).astype(np.int32), s


def add_multipliers_16(s0, s1, s_out) -> dict:
    """LiteRT's int16 ADD / SUB with general scales (``pot_scale_int16`` false): TFLite's ADD
    multipliers with the operands shifted left by 15 bits instead of 20."""
    s0, s1, s_out = (np.float64(np.float32(s)) for s in (s0, s1, s_out))
    twice_max = 2.0 * max(s0, s1)
    return {"0": s0 / twice_max, "1": s1 / twice_max, "out": twice_max / (2.0**ADD_LEFT_SHIFT_16 * s_out)}


def writable_groups(graph, plan, wide_names: set, log) -> set:
    """The names in ``wide_names`` (values or nodes) whose sharing group the 16x8 export writes;
    each other group is reported through ``log`` and left out (it stays 8-bit). An Add / Sub / Mul
    is written in int16 when its output and every activation it reads are int16 (constants are
    rewritten as int16 codes): the groups it reads are widened with its output's, then groups are
    dropped together until none changes."""
    from ..ops.registry import get_op

    producer = {o: n for n in graph.nodes for o in n.outputs}
    readers: dict[str, list] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    groups: dict[str, list[str]] = {}
    for name in plan.activations:
        groups.setdefault(plan.find(name), []).append(name)
    kind = lambda n: plan.kinds.get(n.name) or get_op(n.op).quant_kind(n, graph)  # noqa: E731
    kept_float = {n.name for n, _ in plan.kept_float}
    wide = {root for root, names in groups.items()
            if any(n in wide_names or (n in producer and producer[n].name in wide_names) for n in names)}

    asked = set(wide)  # (groups widened only for an Add / Mul they feed drop back without a note)
    grown = True
    while grown:  # an Add / Mul making a wide value reads wide values: its inputs' groups widen too
        grown = False
        for root in list(wide):
            for p in (producer.get(n) for n in groups[root]):
                if p is not None and kind(p) == "elementwise":
                    more = {plan.find(i) for i in p.inputs if i in plan.activations} - wide
                    wide |= more
                    grown |= bool(more)

    def all_wide(node) -> bool:  # an elementwise op: its output and every activation input int16
        values = [i for i in node.inputs if i and i in plan.activations] + node.outputs[:1]
        return all(plan.find(v) in wide for v in values)

    def blocker(root):
        for name in groups[root]:
            p = producer.get(name)
            if p is not None and (kind(p) not in WIDE_PRODUCERS + ("elementwise",) or
                                  (kind(p) == "elementwise" and not all_wide(p)) or
                                  (kind(p) == "compute" and plan.find(p.inputs[0]) in wide)):
                return p
            for r in readers.get(name, []):
                if r.name in kept_float:  # it reads the value dequantized (TFLite's DEQUANTIZE takes int16)
                    continue
                if kind(r) not in WIDE_READERS + ("lut", "elementwise") or (kind(r) == "elementwise" and not all_wide(r)):
                    return r
        return None

    changed = True
    while changed:
        changed = False
        for root in sorted(wide):
            bad = blocker(root)
            if bad is not None:
                wide.discard(root)
                changed = True
                if root in asked:
                    log(f"note: '{groups[root][0]}' and {len(groups[root]) - 1} value(s) sharing its grid stay 8-bit "
                        f"for TFLite: node '{bad.name}' ({bad.op}) has no 16x8 kernel computing npuforge's integers")
    return {n for root in wide for n in groups[root]}
