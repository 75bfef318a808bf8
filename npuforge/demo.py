"""The main job, with no arguments: EfficientNet-Lite0 with its pretrained
ImageNet weights, from the zoo through ONNX into the npuforge IR, checked, and
run on real photos by npuforge's float executor beside PyTorch and ONNX Runtime.

With ``--data DIR`` it classifies that folder instead and prints top-1.
"""

from __future__ import annotations

import tempfile
import time
from importlib import util
from pathlib import Path

import numpy as np

from .errors import NpuforgeError

# Photographs that scikit-image ships inside its package (no download).
SAMPLE_PHOTOS = ("chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png", "motorcycle_left.png")
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


def _step(msg: str) -> float:
    print(msg, flush=True)
    return time.perf_counter()


def run_demo(args) -> int:
    import onnxruntime as ort
    import torch
    from PIL import Image

    from . import export_onnx, load
    from .ir.summary import summarize
    from .zoo import create_model, get_config
    from .zoo.data import ImageDataset, iter_batches
    from .zoo.transforms import eval_transform

    config = get_config(MODEL)
    t = _step(f"[1/4] {MODEL}: pretrained weights from {config.weight_source}")
    model = create_model(MODEL, pretrained=True).eval()
    transform = eval_transform(config)
    names = config.class_names

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / f"{MODEL}.onnx"
        t = _step(f"[2/4] export to ONNX and import into the npuforge IR")
        export_onnx(model, torch.zeros(1, *config.input_size), str(onnx_path), input_names=("input",),
                    output_names=("logits",))
        graph = load(onnx_path)
        s = summarize(graph)
        print(f"      {s['nodes']} nodes, {s['parameters']:,} parameters, {s['macs'] / 1e6:.0f} M MACs per image, "
              f"checker: ok ({time.perf_counter() - t:.1f} s)")
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])

        if args.data:
            dataset = ImageDataset(args.data, limit=args.limit)
            batches = ((x, y, paths) for x, y, paths in iter_batches(dataset, transform, batch_size=16))
            labelled = True
        else:
            paths = sample_photo_paths()
            x = np.stack([transform(Image.open(p)) for p in paths])
            batches = iter([(x, None, paths)])
            labelled = False

        t = _step(f"[3/4] classify with npuforge (float), PyTorch and ONNX Runtime")
        ours_all, torch_all, ort_all, labels, files = [], [], [], [], []
        for x, y, paths in batches:
            ours_all.append(graph.run({"input": x})["logits"])
            with torch.no_grad():
                torch_all.append(model(torch.from_numpy(x)).numpy())
            ort_all.append(session.run(None, {"input": x})[0])
            files += [Path(p).name for p in paths]
            if y is not None:
                labels.append(y)
        ours, ref_torch, ref_ort = (np.concatenate(a) for a in (ours_all, torch_all, ort_all))
        elapsed = time.perf_counter() - t

    t = _step(f"[4/4] results ({len(files)} images, {elapsed:.1f} s)")
    if not labelled:
        probs = np.exp(ours - ours.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        width = max(len(f) for f in files)
        print(f"      {'image':<{width}}  npuforge top-1 (prob)               PyTorch  ORT")
        for i, f in enumerate(files):
            top = int(ours[i].argmax())
            same_torch = "same" if int(ref_torch[i].argmax()) == top else "DIFF"
            same_ort = "same" if int(ref_ort[i].argmax()) == top else "DIFF"
            print(f"      {f:<{width}}  {names[top][:28]:<28} ({probs[i, top]:.2f})  {same_torch:<7}  {same_ort}")
    else:
        truth = np.concatenate(labels)
        for label, logits in (("npuforge", ours), ("PyTorch", ref_torch), ("ONNX Runtime", ref_ort)):
            print(f"      top-1 {label:<13} {(logits.argmax(1) == truth).mean():.1%}")
    agree = (ours.argmax(1) == ref_ort.argmax(1)).mean()
    print(f"      top-1 agreement npuforge vs ONNX Runtime {agree:.1%}, vs PyTorch "
          f"{(ours.argmax(1) == ref_torch.argmax(1)).mean():.1%}")
    print(f"      max |logit difference| vs ONNX Runtime {np.abs(ours - ref_ort).max():.2e}, "
          f"vs PyTorch {np.abs(ours - ref_torch).max():.2e} (max |logit| {np.abs(ref_ort).max():.1f})")
    return 0
