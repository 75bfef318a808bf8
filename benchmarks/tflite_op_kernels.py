"""LiteRT's default (optimized) int8 kernels against its reference kernels, op by op.

The cases are those of tests/test_tflite_vs_litert.py, where the reference kernels equal
the integer simulator bit for bit; here each exported op also runs on LiteRT's default
kernels (XNNPACK / ruy / optimized_ops) and the codes that differ are counted.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tflite_op_kernels.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_tflite_vs_litert import Lambda, litert_run, quantized  # noqa: E402

from npuforge.export.tflite_export import to_tflite  # noqa: E402
from npuforge.sim.integer import quantize_input  # noqa: E402

TWO = [(1, 8, 16, 16), (1, 8, 16, 16)]
CASES = [
    ("CONV_2D 3x3 + RELU6", nn.Sequential(nn.Conv2d(8, 16, 3, 1, 1), nn.ReLU6()), [(1, 8, 16, 16)], 1.0),
    ("CONV_2D 3x3 stride 2", nn.Conv2d(8, 16, 3, 2, 1), [(1, 8, 16, 16)], 1.0),
    ("DEPTHWISE_CONV_2D 3x3", nn.Conv2d(16, 16, 3, 1, 1, groups=16), [(1, 16, 16, 16)], 1.0),
    ("FULLY_CONNECTED 1280x1000", nn.Linear(1280, 1000), [(1, 1280)], 1.0),
    ("ADD", Lambda(lambda a, b: a + b), TWO, 1.0),
    ("SUB", Lambda(lambda a, b: a - b), TWO, 1.0),
    ("MUL", Lambda(lambda a, b: a * b), TWO, 1.0),
    ("AVERAGE_POOL_2D 2x2", nn.AvgPool2d(2), [(1, 8, 16, 16)], 1.0),
    ("MAX_POOL_2D 3x3 s2", nn.MaxPool2d(3, 2, 1), [(1, 8, 16, 16)], 1.0),
    ("MEAN (global)", nn.AdaptiveAvgPool2d(1), [(1, 32, 7, 7)], 1.0),
    ("CONCATENATION", Lambda(lambda a, b: torch.cat([a, b], 1)), TWO, 1.0),
    ("PAD", Lambda(lambda a: F.pad(a, (1, 2, 0, 1))), [(1, 8, 16, 16)], 1.0),
    ("SOFTMAX 1000", Lambda(lambda a: torch.softmax(a, 1)), [(1, 1000)], 4.0),
    ("LOGISTIC", Lambda(lambda a, b: torch.sigmoid(a + b)), TWO, 3.0),
    ("TANH", Lambda(lambda a, b: torch.tanh(a + b)), TWO, 3.0),
    ("HARD_SWISH", Lambda(lambda a, b: F.hardswish(a + b)), TWO, 3.0),
    ("RELU", Lambda(lambda a, b: torch.relu(a + b)), TWO, 3.0),
    ("RESIZE_BILINEAR x2", nn.Upsample(scale_factor=2, mode="bilinear"), [(1, 8, 16, 16)], 1.0),
    ("RESIZE_NEAREST_NEIGHBOR x2", nn.Upsample(scale_factor=2, mode="nearest"), [(1, 8, 16, 16)], 1.0),
]


def main() -> int:
    print("| op | codes | default kernels differ from reference | largest difference |")
    print("|---|---:|---:|---:|")
    for label, module, shapes, scale in CASES:
        torch.manual_seed(0)
        q = quantized(module, shapes, scale=scale)
        model = to_tflite(q)
        rng = np.random.default_rng(1)
        total = differ = worst = 0
        for _ in range(5):
            feeds = [quantize_input((rng.standard_normal(s) * scale * 1.2).astype(np.float32), q.values[n].quant)
                     for n, s in zip(q.inputs, shapes)]
            ref = litert_run(model, feeds, reference=True)[0].astype(np.int64)
            opt = litert_run(model, feeds, reference=False)[0].astype(np.int64)
            total += ref.size
            differ += int(np.count_nonzero(ref != opt))
            worst = max(worst, int(np.abs(ref - opt).max()))
        print(f"| {label} | {total} | {differ} ({100.0 * differ / total:.2f} %) | {worst} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
