"""AdaRound per layer: each layer's output error with learnt rounding against nearest
rounding, for a few AdaRound settings, on EfficientNet-Lite0 per-tensor
(equalized) with the first 100 images of the folder as calibration data.

    .venv/bin/python benchmarks/adaround_layers.py --data ../shared/data/imagenet-sample-even

The error is the mean squared difference, over all calibration images, between
the float layer's output (fused activation included) on the float network's input
and the layer with quantized weights on the quantized network's input -- what
AdaRound minimises, measured on whole images rather than its training crops.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import npuforge
from npuforge.ops.activation import apply_fused
from npuforge.ops.registry import get_op
from npuforge.quant import adaround as ada
from npuforge.quant.layerwise import run_layerwise, without_activation
from npuforge.workflow import transform_of, zoo_graph
from npuforge.zoo.data import ImageDataset, iter_batches

SETTINGS = {
    "4 img, 32 crop, lr 0.01, 200 steps": dict(iterations=200, images=4, crop=32, reg=0.01, lr=1e-2, seed=0),
    "4 img, 32 crop, lr 0.01, 600 steps": dict(iterations=600, images=4, crop=32, reg=0.01, lr=1e-2, seed=0),
    "8 img, 64 crop, lr 0.03, 200 steps (default)": dict(iterations=200, images=8, crop=64, reg=0.01, lr=3e-2,
                                                          seed=0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--layers", default="1,2,4,20,40,48", help="indices among the weighted layers, graph order")
    args = ap.parse_args()
    graph = zoo_graph("efficientnet_lite0")
    dataset = ImageDataset(args.data, limit=100)
    x = np.concatenate([b for b, _, _ in iter_batches(dataset, transform_of(graph.metadata["preprocess"]), 25)])
    batches = [x[i:i + 25] for i in range(0, len(x), 25)]
    q = npuforge.quantize(graph, batches, {"granularity": "per-tensor", "equalize": True}, log=lambda m: None)
    weighted = [n.name for n in q.nodes if "weight" in n.quant]
    picked = {weighted[int(i)] for i in args.layers.split(",")}
    print("| layer | nearest | " + " | ".join(SETTINGS) + " |")
    print("|---|---:|" + "---:|" * len(SETTINGS))

    def visit(node, xs_f, xs_q, pre_f):
        op, wv = get_op(node.op), q.values[node.inputs[1]]
        wp, w = wv.quant, wv.data.astype(np.float32)
        target = apply_fused(node, pre_f)

        def error(codes):
            wq = torch.from_numpy(wp.dequantize(codes))
            out = apply_fused(node, op.forward(without_activation(node), [xs_q[0], wq, *xs_q[2:]])[0])
            return float((out - target).pow(2).mean())

        cells = [f"{error(wp.quantize(w)):.4g}"]
        for options in SETTINGS.values():
            start = time.perf_counter()
            torch.set_num_threads(1)
            with torch.enable_grad():
                codes = ada._learn(node, w, wp, xs_f, xs_q, 0, options).astype(np.int8)
            torch.set_num_threads(2)
            cells.append(f"{error(codes):.4g} ({time.perf_counter() - start:.0f} s)")
        print(f"| {node.name} | " + " | ".join(cells) + " |", flush=True)

    run_layerwise(q, [{q.inputs[0]: b} for b in batches], picked, visit)


if __name__ == "__main__":
    main()
