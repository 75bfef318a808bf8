"""Where simulations of one quantized program part: the integer simulator, npuforge's
fake-quant executor in float32 and in float64, and the QDQ export in ONNX Runtime (graph
optimizations off).

The float32 simulations round each convolution sum in their kernel's order, so a value
that lands within float32 noise of a rounding boundary takes another code now and then,
and the network carries that code on; torch picks its convolution kernels by batch size,
so the fake-quant executor's float32 codes can even depend on the batch. The script
prints each engine's top-1 on a folder of labelled images, their pairwise top-1
agreement and largest logit difference, and each float32 simulation against itself run
in batches of 25 and of 1.

    .venv/bin/python benchmarks/simulation_divergence.py PROGRAM.nfir --data DIR [--images 200] [--trace 8]

``--trace N`` also compares the integer simulator's codes with float64 fake-quant's, node by
node, on the first N images: where the first codes part, and how far each node carries them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import npuforge  # noqa: E402
from npuforge.export import to_qdq_onnx  # noqa: E402
from npuforge.sim.fake_quant import run_fake_quant  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402
from npuforge.workflow import transform_of  # noqa: E402
from npuforge.zoo.data import ImageDataset, iter_batches  # noqa: E402


def session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program", type=Path, help="a quantized IR (quantize's or qat's output)")
    ap.add_argument("--data", required=True, type=Path, help="labelled images (class subfolders or wnid names)")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--trace", type=int, default=0, metavar="N",
                    help="also compare integer and float64 fake-quant codes node by node on the first N images")
    args = ap.parse_args()
    q = npuforge.load(args.program)
    ds = ImageDataset(args.data)
    ds.samples = ds.samples[:args.images]
    batches = list(iter_batches(ds, transform_of(q.metadata["preprocess"]), 25, 2))
    x, labels = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    sim, qdq = IntegerSimulator(q), session(to_qdq_onnx(q))
    engines = {
        "integer": lambda b: sim.run({q.inputs[0]: b})[q.outputs[0]],
        "fake-quant, float32": lambda b: run_fake_quant(q, {q.inputs[0]: b})[q.outputs[0]],
        "fake-quant, float64": lambda b: run_fake_quant(q, {q.inputs[0]: b}, precision="float64")[q.outputs[0]],
        "QDQ in ORT": lambda b: qdq.run(None, {qdq.get_inputs()[0].name: b})[0],
    }

    def run(engine, batch):
        return np.concatenate([np.asarray(engines[engine](x[i:i + batch])) for i in range(0, len(x), batch)])

    logits = {k: run(k, 25) for k in engines}
    step = float(q.values[q.outputs[0]].quant.scale)
    print(f"{args.program}: {len(labels)} images")
    print("| engine | top-1 |\n|---|---:|")
    for k, v in logits.items():
        print(f"| {k} | {100.0 * float((v.argmax(1) == labels).mean()):.1f} % |")

    def agreement(a, b):
        return f"{int((a.argmax(1) == b.argmax(1)).sum())} of {len(labels)} | {np.abs(a - b).max() / step:.0f}"

    print("\n| pair | same top-1 | logits, largest difference (output steps) |\n|---|---:|---:|")
    names = list(logits)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            print(f"| {a} / {b} | {agreement(logits[a], logits[b])} |")
    for k in ("fake-quant, float32", "QDQ in ORT"):
        print(f"| {k}: batches of 25 / of 1 | {agreement(logits[k], run(k, 1))} |")
    if args.trace:
        trace(q, sim, x[:args.trace])
    return 0


def trace(q, sim, x) -> None:
    """Each node whose output codes differ between the integer simulator and float64
    fake-quant (re-quantized to the value's grid), with how many of its input codes differ."""
    names = [o for n in q.nodes for o in n.outputs if o and q.values[o].quant is not None]
    feeds = {q.inputs[0]: x}
    ints = sim.run(feeds, outputs=names, dequantize=False)
    fake = run_fake_quant(q, feeds, outputs=names, precision="float64")
    differ = {}
    for name in names:
        a = np.asarray(ints[name]).astype(np.int64)
        b = np.asarray(q.values[name].quant.quantize(np.asarray(fake[name], np.float64))).astype(np.int64)
        differ[name] = (int((a != b).sum()), a.size, int(np.abs(a - b).max()))
    print(f"\n{len(x)} images, integer vs float64 fake-quant codes, the nodes where they differ:")
    print("| node | op | input codes that differ | output codes that differ | of | largest (steps) |")
    print("|---|---|---:|---:|---:|---:|")
    for node in q.nodes:
        out = node.outputs[0] if node.outputs else None
        if out not in differ:
            continue
        inputs = sum(differ[i][0] for i in node.inputs if i in differ)
        if differ[out][0] or inputs:
            print(f"| {node.name} | {node.op} | {inputs} | {differ[out][0]} | {differ[out][1]} | {differ[out][2]} |")


if __name__ == "__main__":
    sys.exit(main())
