"""COCO mAP with pycocotools (the reference implementation; npuforge does not write its own)."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np

from ..errors import NpuforgeError

STAT_NAMES = ("map", "map50", "map75", "map_small", "map_medium", "map_large")


def coco_map(dataset, detections: dict) -> dict:
    """COCO box mAP of ``detections`` ({image id: (boxes [n, 4] x0 y0 x1 y1, scores [n], category ids [n])})
    against a :class:`~npuforge.detection.coco.DetectionSet`. Returns mAP@[.5:.95] ("map"), @.5, @.75
    and by object size, each in [0, 1] (-1 where the set has no object of that size)."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        raise NpuforgeError("COCO mAP needs pycocotools (pip install pycocotools)") from None
    raw = copy.deepcopy(dataset.raw)
    for a in raw["annotations"]:
        a.setdefault("iscrowd", 0)
        a.setdefault("area", float(a["bbox"][2] * a["bbox"][3]))
    results = []
    for image_id, (boxes, scores, labels) in detections.items():
        for (x0, y0, x1, y1), s, c in zip(np.asarray(boxes, np.float64), np.asarray(scores), np.asarray(labels)):
            results.append({"image_id": image_id, "category_id": int(c), "score": float(s),
                            "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]})
    if not results:
        return dict.fromkeys(STAT_NAMES, 0.0)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and table
        gt = COCO()
        gt.dataset = raw
        gt.createIndex()
        dt = gt.loadRes(results)
        ev = COCOeval(gt, dt, "bbox")
        ev.params.imgIds = sorted(detections) if detections else ev.params.imgIds
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {name: float(v) for name, v in zip(STAT_NAMES, ev.stats)}
