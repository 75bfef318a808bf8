"""Post-training quantization: npuforge against ONNX Runtime's quantize_static, side by side.

Same model (EfficientNet-Lite0, pretrained), same calibration images (the first
--num-calib of the folder, file order), same evaluation images (the rest), one
run. Every quantized model, ours and ORT's, is a QDQ ONNX file evaluated twice
in ONNX Runtime:

  exact top-1   with ORT's QDQ fusions off: DequantizeLinear -> float op ->
                QuantizeLinear, i.e. exactly the numbers the QDQ model defines
                (npuforge's fake-quant computes the same; see the fake-quant row)
  int8 top-1    with ORT's int8 kernels (all optimizations on); on x86 CPUs
                without VNNI these saturate 16-bit pair sums, see docs/quantization.md
  agree         exact top-1 agreement with the FP32 model on the evaluation images
  quantize s    the whole quantization call (npuforge: optimize + calibrate +
                parameters, and equalization / AdaRound / bias correction where
                the row names them; ORT: quantize_static)
  int8 infer s  ORT int8 inference over the evaluation images

    .venv/bin/python benchmarks/ptq_vs_ort.py --data ../shared/data/imagenet-sample-even
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import npuforge
from npuforge.export import to_qdq_onnx
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.workflow import transform_of, zoo_graph
from npuforge.zoo.data import ImageDataset, iter_batches

OUR_METHODS = ("minmax", "mean", "percentile", "kl", "mse")
ORT_METHODS = ("MinMax", "Entropy", "Percentile")


def session(model, exact: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if exact:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def batched(fn, x: np.ndarray, batch: int = 50) -> np.ndarray:
    return np.concatenate([fn(x[i:i + batch]) for i in range(0, len(x), batch)])


def ort_logits(model, x: np.ndarray, exact: bool = False) -> tuple[np.ndarray, float]:
    sess = session(model, exact)
    name = sess.get_inputs()[0].name
    start = time.perf_counter()
    out = batched(lambda b: sess.run(None, {name: b})[0], x)
    return out, time.perf_counter() - start


def evaluate(name, model, labels, fp32_top, x, seconds) -> dict:
    exact, _ = ort_logits(model, x, exact=True)
    int8, infer_s = ort_logits(model, x)
    top = exact.argmax(1)
    return {"method": name, "exact_top1": 100 * float((top == labels).mean()),
            "agree": 100 * float((top == fp32_top).mean()),
            "int8_top1": 100 * float((int8.argmax(1) == labels).mean()), "quantize_s": seconds,
            "int8_infer_s": infer_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="image folder (ImageNet-style <wnid>_name files)")
    ap.add_argument("--num-calib", type=int, default=100)
    ap.add_argument("--model", default="efficientnet_lite0")
    ap.add_argument("--ours", default=",".join(OUR_METHODS), help="our methods (comma-separated)")
    ap.add_argument("--ort", default=",".join(ORT_METHODS), help="ORT calibrators (comma-separated; empty: none)")
    ap.add_argument("--granularity", default="per-channel,per-tensor")
    ap.add_argument("--reduce-range", action=argparse.BooleanOptionalAction, default=True,
                    help="add per-channel minmax rows with 7-bit weights, ours and ORT's (default on)")
    ap.add_argument("--advanced", action=argparse.BooleanOptionalAction, default=True,
                    help="add rows with equalization, bias correction and AdaRound (default on)")
    ap.add_argument("--adaround-iters", type=int, default=300, help="AdaRound steps per layer (default 300)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()

    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static

    graph = zoo_graph(args.model)
    transform = transform_of(graph.metadata["preprocess"])
    dataset = ImageDataset(args.data)
    xs, ys = [], []
    for x, y, _ in iter_batches(dataset, transform, 50):
        xs.append(x)
        ys.append(y)
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    calib, x_eval, y_eval = x_all[:args.num_calib], x_all[args.num_calib:], y_all[args.num_calib:]
    print(f"{args.model}: calibrate on {len(calib)} images, evaluate on {len(x_eval)} "
          f"({ort.get_device()} ORT {ort.__version__}, torch threads {__import__('torch').get_num_threads()})",
          flush=True)

    tmp = Path(tempfile.mkdtemp())
    float_path = tmp / "float.onnx"
    float_path.write_bytes(npuforge.export.to_onnx(graph).SerializeToString())
    fp32, _ = ort_logits(str(float_path), x_eval)
    fp32_top = fp32.argmax(1)
    ours_fp32 = batched(lambda b: graph.run({graph.inputs[0]: b})[graph.outputs[0]], x_eval)
    print(f"FP32 top-1: ONNX Runtime {100 * (fp32_top == y_eval).mean():.2f}%, npuforge "
          f"{100 * (ours_fp32.argmax(1) == y_eval).mean():.2f}%", flush=True)
    rows = []

    def ours(method, gran, reduce_range=False, fake_quant=False, **steps):
        start = time.perf_counter()
        q = npuforge.quantize(graph, [calib[i:i + 25] for i in range(0, len(calib), 25)],
                              {"method": method, "granularity": gran, "reduce_range": reduce_range, **steps},
                              log=lambda m: None)
        seconds = time.perf_counter() - start
        label = f"npuforge {method} {gran}" + (" reduce-range" if reduce_range else "") + "".join(
            f" +{k.replace('_', '-')}" for k, v in steps.items() if v is True)
        if "adaround_iters" in steps:
            label += f" ({steps['adaround_iters']} iters)"
        r = evaluate(label, to_qdq_onnx(q).SerializeToString(), y_eval, fp32_top, x_eval, seconds)
        if fake_quant:
            fq = batched(lambda b: run_fake_quant(q, {q.inputs[0]: b})[q.outputs[0]], x_eval)
            r["fake_quant_top1"] = 100 * float((fq.argmax(1) == y_eval).mean())
        rows.append(r)
        print(json.dumps(r), flush=True)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"input": calib[i:i + 25]} for i in range(0, len(calib), 25)])

        def get_next(self):
            return next(self.batches, None)

    def theirs(method, gran, reduce_range=False):
        out = tmp / f"ort_{method}_{gran}_{reduce_range}.onnx"
        start = time.perf_counter()
        quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=gran == "per-channel", reduce_range=reduce_range,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, method))
        seconds = time.perf_counter() - start
        label = f"ORT {method} {gran}" + (" reduce_range" if reduce_range else "")
        rows.append(evaluate(label, str(out), y_eval, fp32_top, x_eval, seconds))
        print(json.dumps(rows[-1]), flush=True)

    for gran in [g for g in args.granularity.split(",") if g]:
        for method in [m for m in args.ours.split(",") if m]:
            ours(method, gran, fake_quant=(method == "minmax" and gran == "per-channel"), equalize=False)
        if gran == "per-tensor":
            for method in [m for m in args.ours.split(",") if m]:
                ours(method, gran, equalize=True)
        for method in [m for m in args.ort.split(",") if m]:
            theirs(method, gran)
    if args.reduce_range:
        ours("minmax", "per-channel", reduce_range=True, fake_quant=True, equalize=False)
        theirs("MinMax", "per-channel", reduce_range=True)
    if args.advanced:
        iters = {"adaround_iters": args.adaround_iters}
        ours("minmax", "per-tensor", equalize=False, bias_correction=True)
        ours("minmax", "per-tensor", equalize=True, bias_correction=True)
        ours("minmax", "per-tensor", equalize=True, bias_correction=True, adaround=True, **iters)
        ours("minmax", "per-channel", equalize=False, adaround=True, **iters)

    print()
    print(f"FP32 top-1 {100 * (fp32_top == y_eval).mean():.2f}% on {len(y_eval)} images "
          f"(npuforge float {100 * (ours_fp32.argmax(1) == y_eval).mean():.2f}%)")
    print()
    print("| method | exact top-1 % | agree with FP32 % | ORT int8 top-1 % | quantize s | int8 infer s | "
          "npuforge fake-quant top-1 % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        fq = f"{r['fake_quant_top1']:.2f}" if "fake_quant_top1" in r else ""
        print(f"| {r['method']} | {r['exact_top1']:.2f} | {r['agree']:.2f} | {r['int8_top1']:.2f} | "
              f"{r['quantize_s']:.1f} | {r['int8_infer_s']:.1f} | {fq} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
