"""Which option of `--target tflite` moves the short-range BlazeFace detections on the face photos.

Quantizes the detector as benchmarks/blazeface_detect.py does (per channel, the box path in int16,
NonMaxSuppression in float, the first --num-calib shared photos), adding one option of the TFLite
target at a time, and prints for each the mAP@0.5 against the FP32 detections on the face photos,
the faces kept, and the scores the integer simulator gives the FP32 faces (the detector keeps a
score above its threshold).

    .venv/bin/python benchmarks/blazeface_tflite_trace.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from blazeface_detect import DATA, as_truth  # noqa: E402

import npuforge  # noqa: E402
from npuforge.detection.blazeface import DETECTORS, detections, detector_graph, preprocess  # noqa: E402
from npuforge.detection.faces import face_photos  # noqa: E402
from npuforge.detection.metric import coco_map  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402

OPTIONS = [("default", {}), ("int8 activations", {"activation_dtype": "int8"}),
           ("norm_spread_codes 0", {"norm_spread_codes": 0.0}), ("tflite_multipliers", {"tflite_multipliers": True}),
           ("int8 + tflite_multipliers", {"activation_dtype": "int8", "tflite_multipliers": True}),
           ("target tflite", {"target": "tflite"})]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--detector", default="face_detection_short_range", choices=list(DETECTORS))
    ap.add_argument("--num-calib", type=int, default=64)
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    g = detector_graph(args.detector)
    size = DETECTORS[args.detector].size
    calib = [preprocess(Image.open(p), size)[0] for p in sorted(Path(args.data).glob("*.JPEG"))[:args.num_calib]]
    images, feeds, truth, faces = [], [], {}, []
    for p in face_photos(Path(tempfile.mkdtemp())):
        img = Image.open(p)
        x, box = preprocess(img, size)
        out = g.run({"input": x})
        truth[len(images)] = detections(out, size, box)
        keep = np.asarray(out["selected"], np.int64).reshape(-1, 3)[:, 2]
        faces += [(len(images), int(a), float(np.asarray(out["scores"])[0, 0, a])) for a in keep]
        images.append((p, img.width, img.height))
        feeds.append((x, box))
    gt = as_truth(images, truth)
    print(f"{args.detector}: {len(images)} face photos, {len(faces)} FP32 faces, scores "
          f"{', '.join(f'{s:.3f}' for _, _, s in faces)}")
    base = {"granularity": "per-channel", "keep_float": ["detect/NonMaxSuppression"],
            "int16": g.metadata["detector"]["int16"]}
    for label, extra in OPTIONS:
        sim = IntegerSimulator(npuforge.quantize(g, calib, {**base, **extra}, log=lambda m: None))
        outs = [sim.run({"input": x}) for x, _ in feeds]
        found = {k: detections(o, size, box) for k, (o, (_, box)) in enumerate(zip(outs, feeds))}
        m = coco_map(gt, {k: (b, s, np.ones(len(b), np.int64)) for k, (b, s) in found.items()})
        scores = [float(np.asarray(outs[k]["scores"])[0, 0, a]) for k, a, _ in faces]
        print(f"  {label:<27} mAP@0.5 {m['map50']:.3f}  faces kept {sum(len(b) for b, _ in found.values())}  "
              f"scores at the FP32 faces {', '.join(f'{s:.3f}' for s in scores)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
