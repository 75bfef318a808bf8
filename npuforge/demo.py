"""The main job, with no arguments: EfficientNet-Lite0 with its pretrained
ImageNet weights, from the zoo into the npuforge IR, optimized, calibrated and
quantized to int8, then FP32 and INT8 predictions side by side on real photos
(the ones scikit-image ships).

With ``--data DIR`` it calibrates on the first --num-calib images of DIR and
prints FP32 and INT8 top-1 on the rest.
"""

from __future__ import annotations

import time
from importlib import util
from pathlib import Path

import numpy as np

from .errors import NpuforgeError

# Photographs that scikit-image ships inside its package (no download).
SAMPLE_PHOTOS = ("chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png", "motorcycle_left.png",
                 "hubble_deep_field.jpg", "retina.jpg", "ihc.png", "brick.png", "grass.png", "gravel.png", "color.png")
MODEL = "efficientnet_lite0"


def sample_photo_paths() -> list[Path]:
    spec = util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise NpuforgeError("the demo photos come from scikit-image: pip install scikit-image, or pass --data DIR")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    paths = [folder / name for name in SAMPLE_PHOTOS if (folder / name).is_file()]
    if not paths:
        raise NpuforgeError(f"no sample photos found in {folder}; pass --data DIR")
    return paths


def run_demo(args) -> int:
    from PIL import Image

    from . import quantize
    from .ir.summary import summarize
    from .sim.fake_quant import run_fake_quant
    from .workflow import ORT_VNNI_NOTE, cpu_lacks_vnni, forward_of, transform_of, zoo_graph
    from .zoo import get_config
    from .zoo.data import ImageDataset, iter_batches

    config = get_config(MODEL)
    t = time.perf_counter()
    print(f"[1/4] {MODEL}: pretrained weights from {config.weight_source}", flush=True)
    graph = zoo_graph(MODEL)
    s = summarize(graph)
    print(f"      imported: {s['nodes']} nodes, {s['parameters']:,} parameters, {s['macs'] / 1e6:.0f} M MACs "
          f"per image ({time.perf_counter() - t:.1f} s)")
    transform = transform_of(graph.metadata["preprocess"])

    if args.data:
        dataset = ImageDataset(args.data)
        if len(dataset) <= args.num_calib:
            raise NpuforgeError(f"--data {args.data}: holds {len(dataset)} images; it needs more than "
                                f"--num-calib {args.num_calib} (calibration) to evaluate on the rest")
        batches = list(iter_batches(dataset, transform, 25))
        x = np.concatenate([b[0] for b in batches])
        labels = np.concatenate([b[1] for b in batches])
        calib, x_eval, y_eval = x[:args.num_calib], x[args.num_calib:], labels[args.num_calib:]
        if args.limit:
            x_eval, y_eval = x_eval[:args.limit], y_eval[:args.limit]
        files = None
    else:
        paths = sample_photo_paths()
        x_eval = np.stack([transform(Image.open(p)) for p in paths])
        calib, y_eval, files = x_eval, None, [p.name for p in paths]

    t = time.perf_counter()
    print(f"[2/4] optimize, calibrate (minmax, {len(calib)} images) and quantize: per-channel int8 weights, "
          f"uint8 activations", flush=True)
    qgraph = quantize(graph, [calib[i:i + 25] for i in range(0, len(calib), 25)], log=lambda m: None)
    meta = qgraph.metadata["quantization"]
    print(f"      {meta['quantized_nodes']} nodes in int8, {len(meta['float_nodes'])} in float "
          f"({time.perf_counter() - t:.1f} s)")

    t = time.perf_counter()
    print(f"[3/4] classify {len(x_eval)} images: FP32, INT8 (npuforge fake-quant), INT8 QDQ in ONNX Runtime",
          flush=True)

    def batched(fn):
        return np.concatenate([fn(x_eval[i:i + 25]) for i in range(0, len(x_eval), 25)])

    fp32 = batched(lambda b: graph.run({graph.inputs[0]: b})[graph.outputs[0]])
    int8 = batched(lambda b: run_fake_quant(qgraph, {qgraph.inputs[0]: b})[qgraph.outputs[0]])
    qdq = batched(forward_of(qgraph, "ort"))
    print(f"      ({time.perf_counter() - t:.1f} s)")

    print("[4/4] results")
    names = config.class_names
    if files is not None:
        probs = np.exp(int8 - int8.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        width = max(len(f) for f in files)
        print(f"      {'image':<{width}}  {'FP32 top-1':<24}  {'INT8 top-1 (prob)':<31}  same")
        for i, f in enumerate(files):
            a, b = int(fp32[i].argmax()), int(int8[i].argmax())
            print(f"      {f:<{width}}  {names[a][:24]:<24}  {names[b][:24]:<24} ({probs[i, b]:.2f})  "
                  f"{'yes' if a == b else 'NO'}")
    else:
        for label, logits in (("FP32", fp32), ("INT8 fake-quant", int8), ("INT8 QDQ in ORT", qdq)):
            print(f"      top-1 {label:<16} {100 * (logits.argmax(1) == y_eval).mean():.1f}%")
    agree = 100 * (fp32.argmax(1) == int8.argmax(1)).mean()
    cos = (fp32 * int8).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(int8, axis=1))
    print(f"      INT8 vs FP32: top-1 agreement {agree:.1f}%, mean logit cosine {cos.mean():.4f}; "
          f"ONNX Runtime QDQ vs fake-quant top-1 agreement {100 * (qdq.argmax(1) == int8.argmax(1)).mean():.1f}%")
    if cpu_lacks_vnni():
        print(f"      {ORT_VNNI_NOTE}")
    return 0
