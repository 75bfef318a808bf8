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
* graph outputs (int16 in the file).

A widened group with any other producer or reader (an int16 input to a convolution, an Add, a
Mul: LiteRT's 16-bit kernels round differently from npuforge's rules there) stays in 8 bits,
and the log says so.
"""

from __future__ import annotations

import numpy as np

from .requant import quantize_multiplier

WIDE_PRODUCERS = ("compute", "lut", "concat", "passthrough")  # quantization kinds whose int16 output is written
WIDE_READERS = ("concat", "passthrough")  # kinds that may read an int16 value (code moves)
WIDENING_BITS = 7  # an int8 code minus its zero point, times 2^7, is an int16 code (|x - zp| <= 255)


def multiplier_16x8(real) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, shift) whose single-rounding requantization is LiteRT's 16x8 one: TFLite's
    QuantizeMultiplier, then the multiplier rounded to its high 16 bits (kept at bit 31)."""
    m, s = quantize_multiplier(np.atleast_1d(np.asarray(real, np.float64)))
    m = m.astype(np.int64)
    high = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    return (high << 16).astype(np.int32), s


def writable_groups(graph, plan, wide_names: set, log) -> set:
    """The names in ``wide_names`` (values or nodes) whose sharing group the 16x8 export writes;
    each other group is reported through ``log`` and left out (it stays 8-bit)."""
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
    keep = set()
    for names in groups.values():
        if not any(n in wide_names or (n in producer and producer[n].name in wide_names) for n in names):
            continue
        bad = [p for p in (producer.get(n) for n in names) if p is not None and kind(p) not in WIDE_PRODUCERS]
        bad += [r for n in names for r in readers.get(n, []) if kind(r) not in WIDE_READERS]
        if bad:
            log(f"note: '{names[0]}' and {len(names) - 1} value(s) sharing its grid stay 8-bit for TFLite: node "
                f"'{bad[0].name}' ({bad[0].op}) has no 16x8 kernel computing npuforge's integers")
            continue
        keep.update(names)
    return keep
