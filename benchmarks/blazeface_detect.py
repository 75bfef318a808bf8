"""BlazeFace end to end: FP32 detections against int8 ones, with float and with integer NMS.

    .venv/bin/python benchmarks/blazeface_detect.py [--num-calib 64] [--scan 200] [--detectors NAME,...] [--only-tflite]

For each MediaPipe detector (short and full range) as one npuforge graph (network, box decoding,
sigmoid, NonMaxSuppression; npuforge/detection/blazeface.py): quantize it per channel and per
tensor (uint8 activations) on --num-calib shared-sample photos, letterboxed as the detector
sees them, once with NonMaxSuppression kept in float (int8 network, float post-processing)
and once with integer NMS (end to end in integers), then with integer NMS and the box path
(regressor convolutions to decoded boxes) in int16, as `npuforge quantize` does for a detector
graph, and last as `npuforge quantize --target tflite` does (int8 activations, TFLite's arithmetic,
the box path in int16 where LiteRT's 16x8 kernels compute the same integers, float NMS). Evaluate on the face photos (the
insightface 2.1 wheel's images and scikit-image's astronaut) and on the photos among the next
--scan shared-sample photos where FP32 finds a face: COCO mAP@0.5 (and mAP@[.5:.95]) of each
int8 detector with the FP32 detections as ground truth (pycocotools), on all of them and on the
face photos alone, and the share of images on which the integer simulator and fake-quant keep
the same boxes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import npuforge  # noqa: E402
from npuforge.detection.blazeface import DETECTORS, detections, detector_graph, preprocess  # noqa: E402
from npuforge.detection.faces import face_photos  # noqa: E402
from npuforge.detection.metric import coco_map  # noqa: E402
from npuforge.sim.fake_quant import run_fake_quant  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "imagenet-sample-even"


def as_truth(images: list, found: dict, keep=None) -> object:
    """A one-category COCO set whose boxes are the FP32 detections (of the images ``keep`` picks)."""
    from types import SimpleNamespace

    anns = []
    keep = keep or (lambda k: True)
    images = [im if keep(k) else None for k, im in enumerate(images)]
    for k, (boxes, _) in found.items():
        if images[k] is None:
            continue
        for x0, y0, x1, y1 in boxes.tolist():
            anns.append({"id": len(anns) + 1, "image_id": k, "category_id": 1, "bbox": [x0, y0, x1 - x0, y1 - y0],
                         "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    raw = {"images": [{"id": k, "file_name": str(im[0]), "width": im[1], "height": im[2]}
                      for k, im in enumerate(images) if im is not None],
           "annotations": anns, "categories": [{"id": 1, "name": "face"}]}
    return SimpleNamespace(raw=raw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-calib", type=int, default=64)
    ap.add_argument("--scan", type=int, default=200, help="shared photos after the calibration ones to scan")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--detectors", default=",".join(DETECTORS), help="comma-separated (default: both)")
    ap.add_argument("--only-tflite", action="store_true", help="only the --target tflite variant")
    args = ap.parse_args()
    photos = sorted(Path(args.data).glob("*.JPEG"))
    tmp = Path(tempfile.mkdtemp())
    for name, spec in DETECTORS.items():
        if name not in args.detectors.split(","):
            continue
        g = detector_graph(name)
        size = spec.size
        calib = [preprocess(Image.open(p), size)[0] for p in photos[:args.num_calib]]
        candidates = face_photos(tmp) + photos[args.num_calib:args.num_calib + args.scan]
        images, feeds, truth = [], [], {}
        t0 = time.perf_counter()
        for p in candidates:
            img = Image.open(p)
            x, box = preprocess(img, size)
            b, s = detections(g.run({"input": x}), size, box)
            if len(b) or p.suffix != ".JPEG":  # every face photo; shared photos where FP32 finds a face
                truth[len(images)] = (b, s)
                images.append((p, img.width, img.height))
                feeds.append((x, box))
        faces = sum(len(b) for b, _ in truth.values())
        print(f"\n{name}: {len(images)} images ({sum(p.suffix != '.JPEG' for p, _, _ in images)} face photos, the rest "
              f"shared photos with an FP32 face), {faces} FP32 faces; float pass {time.perf_counter() - t0:.0f} s")
        gt = as_truth(images, truth)
        face_ids = [k for k, (p, _, _) in enumerate(images) if p.suffix != ".JPEG"]
        gt_faces = as_truth(images, truth, lambda k: k in face_ids)
        print(f"{'granularity':<13}{'NMS':<9}{'boxes':<7}{'mAP@0.5':>9}{'mAP':>8}{'face photos':>13}"
              f"{'int = fake-quant':>18}{'faces':>7}")
        variants = [(gr, nms, bits) for gr in ("per-channel", "per-tensor") for nms, bits in
                    (("float", 8), ("integer", 8), ("integer", 16))] + [("per-channel", "float", "tflite")]
        if args.only_tflite:
            variants = variants[-1:]
        for granularity, nms, bits in variants:
            keep = ["detect/NonMaxSuppression"] if nms == "float" else []
            int16 = g.metadata["detector"]["int16"] if bits != 8 else []
            # "tflite": quantize --target tflite (the box path in int16 where LiteRT's 16x8 kernels compute
            # npuforge's integers, int8 elsewhere); NMS stays float, as TFLite has no integer NMS to export
            target = {"target": "tflite"} if bits == "tflite" else {}
            q = npuforge.quantize(g, calib, {"granularity": granularity, "keep_float": keep, "int16": int16,
                                             **target}, log=lambda m: None)
            sim = IntegerSimulator(q)
            found, same = {}, 0
            for k, (x, box) in enumerate(feeds):
                out = sim.run({"input": x})
                found[k] = detections(out, size, box)
                fake = run_fake_quant(q, {"input": x})
                same += int(np.array_equal(np.asarray(out["selected"]), np.asarray(fake["selected"])))
            dets = {k: (b, s, np.ones(len(b), np.int64)) for k, (b, s) in found.items()}
            m = coco_map(gt, dets)
            mf = coco_map(gt_faces, {k: dets[k] for k in face_ids})
            print(f"{granularity:<13}{nms:<9}{bits!s:<7}{m['map50']:>9.3f}{m['map']:>8.3f}{mf['map50']:>13.3f}"
                  f"{same:>11}/{len(feeds):<6}{sum(len(b) for b, _ in found.values()):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
