"""Post-training quantization: npuforge against ONNX Runtime's quantize_static, side by side.

Same model (EfficientNet-Lite0, pretrained), same calibration images (the first
--num-calib of the folder, file order), same evaluation images (the rest), one
run. Ours are evaluated with npuforge's fake-quant executor; ORT's models with
ONNX Runtime (its int8 kernels). Columns:

  top-1         on the evaluation images
  agree         top-1 agreement with the FP32 model on those images
  quantize s    the whole quantization call (npuforge: optimize + calibrate +
                parameters; ORT: quantize_static), so calibration dominates
  ORT infer s   the QDQ model in ONNX Runtime over the evaluation images

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


def session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def batched(fn, x: np.ndarray, batch: int = 50) -> np.ndarray:
    return np.concatenate([fn(x[i:i + batch]) for i in range(0, len(x), batch)])


def ort_logits(model, x: np.ndarray) -> tuple[np.ndarray, float]:
    sess = session(model)
    name = sess.get_inputs()[0].name
    start = time.perf_counter()
    out = batched(lambda b: sess.run(None, {name: b})[0], x)
    return out, time.perf_counter() - start


def row(name, logits, labels, fp32_top, seconds, infer_s) -> dict:
    top = logits.argmax(1)
    return {"method": name, "top1": 100 * float((top == labels).mean()),
            "agree": 100 * float((top == fp32_top).mean()), "quantize_s": seconds, "ort_infer_s": infer_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="image folder (ImageNet-style <wnid>_name files)")
    ap.add_argument("--num-calib", type=int, default=100)
    ap.add_argument("--model", default="efficientnet_lite0")
    ap.add_argument("--ours", default=",".join(OUR_METHODS), help="our methods (comma-separated)")
    ap.add_argument("--ort", default=",".join(ORT_METHODS), help="ORT calibrators (comma-separated; empty: none)")
    ap.add_argument("--granularity", default="per-channel,per-tensor")
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
    rows = [row("FP32 (ORT)", fp32, y_eval, fp32_top, 0.0, 0.0),
            row("FP32 (npuforge)", ours_fp32, y_eval, fp32_top, 0.0, 0.0)]
    print(json.dumps(rows[-1]), flush=True)

    for gran in [g for g in args.granularity.split(",") if g]:
        for method in [m for m in args.ours.split(",") if m]:
            start = time.perf_counter()
            q = npuforge.quantize(graph, [calib[i:i + 25] for i in range(0, len(calib), 25)],
                                  {"method": method, "granularity": gran}, log=lambda m: None)
            seconds = time.perf_counter() - start
            logits = batched(lambda b: run_fake_quant(q, {q.inputs[0]: b})[q.outputs[0]], x_eval)
            qdq, infer_s = ort_logits(to_qdq_onnx(q).SerializeToString(), x_eval)
            r = row(f"npuforge {method} {gran}", logits, y_eval, fp32_top, seconds, infer_s)
            r["qdq_ort_top1"] = 100 * float((qdq.argmax(1) == y_eval).mean())
            rows.append(r)
            print(json.dumps(r), flush=True)

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.batches = iter([{"input": calib[i:i + 25]} for i in range(0, len(calib), 25)])

            def get_next(self):
                return next(self.batches, None)

        for method in [m for m in args.ort.split(",") if m]:
            out = tmp / f"ort_{method}_{gran}.onnx"
            start = time.perf_counter()
            quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=gran == "per-channel", activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, calibrate_method=getattr(CalibrationMethod, method))
            seconds = time.perf_counter() - start
            logits, infer_s = ort_logits(str(out), x_eval)
            rows.append(row(f"ORT {method} {gran}", logits, y_eval, fp32_top, seconds, infer_s))
            print(json.dumps(rows[-1]), flush=True)

    print()
    print("| method | top-1 % | agree with FP32 % | quantize s | ORT infer s | our QDQ in ORT top-1 % |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        qdq = f"{r['qdq_ort_top1']:.2f}" if "qdq_ort_top1" in r else ""
        print(f"| {r['method']} | {r['top1']:.2f} | {r['agree']:.2f} | {r['quantize_s']:.1f} | "
              f"{r['ort_infer_s']:.1f} | {qdq} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
