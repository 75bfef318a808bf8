"""Zoo models quantized by npuforge, exported to int8 TFLite, run in LiteRT.

For each model: calibrate on the first --num-calib photos of the shared sample and
quantize twice, with ``--target tflite`` (``QuantConfig(target="tflite")``: int8
activations, TFLite's arithmetic) and with the default configuration; export the first
to ``.tflite``, then on the next --num-eval photos run the integer simulator and LiteRT
(reference kernels, and its default optimized kernels) on the same int8 input codes
and count the photos whose output codes agree bit for bit; top-1 of each against the
labels beside the float model's and the default quantization's (integer simulator), and
the photos where the two quantizations' top-1 differ, and each quantization's mean relative error
of the logits against float (|int - float| / |float| per photo), a finer measure than top-1. With Vela installed (``pip install ethos-u-vela``)
each export is also compiled for an Ethos-U55-256 and its operator placement printed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tflite_litert.py
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import npuforge
from npuforge.export.litert_check import interpreter, run_litert, tflite_codes
from npuforge.export.tflite_export import to_tflite
from npuforge.quant import QuantConfig
from npuforge.sim.integer import IntegerSimulator, quantize_input
from npuforge.workflow import transform_of, zoo_graph
from npuforge.zoo.data import ImageDataset, iter_batches

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imagenet-sample-even"


def vela_summary(model: Path, out: Path) -> str:
    vela = shutil.which("vela") or str(Path(sys.executable).with_name("vela"))
    if not Path(vela).exists():
        return "vela not installed"
    run = subprocess.run([vela, str(model), "--accelerator-config", "ethos-u55-256", "--output-dir", str(out)],
                         capture_output=True, text=True, timeout=900)
    if run.returncode:
        return f"vela failed: {(run.stderr or run.stdout).strip().splitlines()[-1]}"
    npu = re.search(r"NPU operators = (\d+) \(([\d.]+)%\)", run.stdout)
    cpu = re.search(r"CPU operators = (\d+)", run.stdout)
    sram = re.search(r"Total SRAM used\s+([\d.]+ KiB)", run.stdout)
    return f"NPU {npu.group(1)} ops ({npu.group(2)} %), CPU {cpu.group(1)}, SRAM {sram.group(1)}"


def bench(name: str, data: Path, num_calib: int, num_eval: int, out_dir: Path) -> dict:
    graph = zoo_graph(name)
    transform = transform_of(graph.metadata["preprocess"])
    calib = [x for x, _, _ in iter_batches(ImageDataset(data, limit=num_calib), transform, 25)]
    t = time.perf_counter()
    q = npuforge.quantize(graph, calib, QuantConfig(target="tflite"), log=lambda m: None)
    base = npuforge.quantize(graph, calib, log=lambda m: None)  # the default quantization
    model = to_tflite(q)
    path = out_dir / f"{name}_int8.tflite"
    path.write_bytes(model)
    print(f"{name}: quantized and exported in {time.perf_counter() - t:.1f} s ({len(model) / 1e6:.2f} MB)",
          flush=True)
    sim, base_sim = IntegerSimulator(q), IntegerSimulator(base)
    ref, default = interpreter(model, reference=True), interpreter(model, reference=False)
    inp, out = q.inputs[0], q.outputs[0]
    counts = {"photos": 0, "ref_equal": 0, "default_equal": 0, "default_codes_differ": 0, "default_max_diff": 0}
    top1 = {"float": 0, "default_quantization": 0, "integer": 0, "litert_ref": 0, "litert_default": 0}
    counts["top1_differs"] = 0
    logit_error = {"default_quantization": 0.0, "target": 0.0}  # sum over photos of |int - float| / |float|
    seconds = {"integer": 0.0, "litert_ref": 0.0, "litert_default": 0.0}
    for x, labels, _ in iter_batches(ImageDataset(data, skip=num_calib, limit=num_eval), transform, 1):
        codes = quantize_input(x, q.values[inp].quant)
        t = time.perf_counter()
        ours = tflite_codes(q, out, sim.run({inp: codes}, dequantize=False)[out]).astype(np.int64)
        seconds["integer"] += time.perf_counter() - t
        fed = [tflite_codes(q, inp, codes)]
        t = time.perf_counter()
        r = run_litert(ref, fed)[0].astype(np.int64)
        seconds["litert_ref"] += time.perf_counter() - t
        t = time.perf_counter()
        d = run_litert(default, fed)[0].astype(np.int64)
        seconds["litert_default"] += time.perf_counter() - t
        floats = graph.run({inp: x})[out]
        default_q = base_sim.run({base.inputs[0]: x})[base.outputs[0]]
        counts["top1_differs"] += int(np.argmax(default_q) != np.argmax(ours))
        target_q = sim.run({inp: codes})[out]  # --target tflite's logits, dequantized
        for key, logits in (("default_quantization", default_q), ("target", target_q)):
            logit_error[key] += float(np.linalg.norm(logits - floats) / np.linalg.norm(floats))
        counts["photos"] += 1
        counts["ref_equal"] += int(np.array_equal(ours, r))
        counts["default_equal"] += int(np.array_equal(ours, d))
        counts["default_codes_differ"] += int(np.count_nonzero(ours != d))
        counts["default_max_diff"] = max(counts["default_max_diff"], int(np.abs(ours - d).max()))
        for key, logits in (("float", floats), ("default_quantization", default_q), ("integer", ours),
                            ("litert_ref", r), ("litert_default", d)):
            top1[key] += int(np.argmax(logits) == labels[0])
    n = counts["photos"]
    return {"model": name, **counts, **{f"top1_{k}": 100.0 * v / n for k, v in top1.items()},
            **{f"ms_{k}": 1000.0 * v / n for k, v in seconds.items()},
            **{f"logit_error_{k}": v / n for k, v in logit_error.items()},
            "vela": vela_summary(path, out_dir / "vela"), "bytes": len(model)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--models", default="efficientnet_lite0,mobilenet_v2")
    ap.add_argument("--num-calib", type=int, default=100)
    ap.add_argument("--num-eval", type=int, default=100)
    ap.add_argument("--out-dir", type=Path, default=None, help="where the .tflite files go (default: a temp dir)")
    args = ap.parse_args()
    if not args.data.is_dir():
        print(f"{args.data}: no image folder (the shared sample); give --data DIR", file=sys.stderr)
        return 2
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="npuforge-tflite-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [bench(m, args.data, args.num_calib, args.num_eval, out_dir) for m in args.models.split(",")]
    print()
    print("| model | photos | LiteRT reference = integer sim | LiteRT default = integer sim | default: codes differing "
          "(max) | top-1 float / default quantization / --target tflite (integer sim) / LiteRT ref / LiteRT default "
          "| photos whose top-1 the target changes | logits' error vs float: default / target "
          "| ms per photo: sim / ref / default | Vela (Ethos-U55-256) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['photos']} | {r['ref_equal']} / {r['photos']} | {r['default_equal']} / "
              f"{r['photos']} | {r['default_codes_differ']} of {r['photos'] * 1000} ({r['default_max_diff']}) | "
              f"{r['top1_float']:.2f} / {r['top1_default_quantization']:.2f} / {r['top1_integer']:.2f} / "
              f"{r['top1_litert_ref']:.2f} / {r['top1_litert_default']:.2f} % | {r['top1_differs']} | "
              f"{r['logit_error_default_quantization']:.4f} / {r['logit_error_target']:.4f} | "
              f"{r['ms_integer']:.0f} / {r['ms_litert_ref']:.0f} / {r['ms_litert_default']:.1f} | {r['vela']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
