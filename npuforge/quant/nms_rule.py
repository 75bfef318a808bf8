"""Integer non-maximum suppression (quantization kind "nms"): NonMaxSuppression on the codes of
quantized boxes and scores, so a detector runs end to end in integers.

ONNX's rule, per batch and class: candidates by score, highest first (equal scores by lower
box index), those at or below ``score_threshold`` dropped; a candidate is kept unless a kept
box overlaps it with an IoU strictly above ``iou_threshold``; at most
``max_output_boxes_per_class`` kept. In integers:

* scores: a code passes when its real value is above the threshold; the quantizer stores the
  smallest such code (``score_min_code``), found by dequantizing every code of the dtype as
  the float path does, so the two agree on every code. Ordering by code is ordering by score.
* boxes (one scale for all coordinates): corners in half-code units, ``x0 = 2 (cx - zp) -
  (w - zp)`` and ``x1 = 2 (cx - zp) + (w - zp)`` for centre boxes (``center_point_box=1``),
  ``2 (x - zp)`` for corner boxes (either corner first); areas, intersection and union are
  exact int64; a box is suppressed when ``inter * 2^16 > T * union`` with ``T = round(iou_threshold
  * 2^16)`` (``iou_num``), i.e. the IoU test with the threshold on a 2^-16 grid. Degenerate
  boxes (no positive area or overlap) never suppress, as in the float rule.
"""

from __future__ import annotations

import numpy as np
import torch

IOU_BITS = 16


def _threshold(graph, node, k: int):
    name = node.inputs[k] if len(node.inputs) > k else ""
    return float(np.asarray(graph.values[name].data).reshape(-1)[0]) if name else None


def quantize_integers(graph, node, add) -> None:
    sq = graph.values[node.inputs[1]].quant
    threshold = _threshold(graph, node, 4)
    codes = np.arange(sq.qmin, sq.qmax + 1)
    if threshold is None:
        first = sq.qmin
    else:  # the float rule compares dequantized float32 scores with the float32 threshold
        passing = codes[sq.dequantize(codes.astype(np.int64)) > np.float32(threshold)]
        first = int(passing[0]) if passing.size else sq.qmax + 1
    add("score_min_code", np.asarray(first, np.int32))
    iou = _threshold(graph, node, 3)
    add("iou_num", np.asarray(int(round((iou or 0.0) * 2**IOU_BITS)), np.int64))


def _corners(q: np.ndarray, zp: int, centre: bool) -> tuple:
    q = q.astype(np.int64) - zp
    if centre:
        cx, cy, w, h = (2 * q[:, 0], 2 * q[:, 1], q[:, 2], q[:, 3])
        return cx - w, cx + w, cy - h, cy + h
    x0, x1 = np.minimum(q[:, 1], q[:, 3]) * 2, np.maximum(q[:, 1], q[:, 3]) * 2
    y0, y1 = np.minimum(q[:, 0], q[:, 2]) * 2, np.maximum(q[:, 0], q[:, 2]) * 2
    return x0, x1, y0, y1


def suppress_integer(boxes: np.ndarray, scores: np.ndarray, zp_box: int, centre: bool, min_code: int,
                     iou_num: int, max_out: int) -> list[int]:
    """Indices kept for one batch and class: ``boxes`` [N, 4] and ``scores`` [N] are codes."""
    x0, x1, y0, y1 = _corners(boxes, zp_box, centre)
    area = (x1 - x0) * (y1 - y0)
    s = scores.astype(np.int64)
    order = np.argsort(-s, kind="stable")
    order = order[s[order] >= min_code]
    kept: list[int] = []
    for i in order.tolist():
        if len(kept) >= max_out:
            break
        if kept:
            k = np.asarray(kept)
            iw = np.minimum(x1[i], x1[k]) - np.maximum(x0[i], x0[k])
            ih = np.minimum(y1[i], y1[k]) - np.maximum(y0[i], y0[k])
            inter = iw * ih
            union = area[i] + area[k] - inter
            ok = (iw > 0) & (ih > 0) & (area[i] > 0) & (area[k] > 0) & (union > 0)
            if np.any(ok & (inter << IOU_BITS > iou_num * union)):
                continue
        kept.append(i)
    return kept


def integer_forward(sim, node, env) -> list:
    bq = sim._q(node.inputs[0])
    boxes = sim._as_codes(node.inputs[0], env).numpy()
    scores = sim._as_codes(node.inputs[1], env).numpy()
    max_name = node.inputs[2] if len(node.inputs) > 2 else ""
    max_out = int(np.asarray(sim.graph.values[max_name].data).reshape(-1)[0]) if max_name else 0
    min_code = int(sim._int(node, "score_min_code"))
    iou_num = int(sim._int(node, "iou_num"))
    centre = bool(node.attrs["center_point_box"])
    selected = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            kept = suppress_integer(boxes[b], scores[b, c], int(bq.zero_point), centre, min_code, iou_num, max_out)
            selected += [(b, c, i) for i in kept]
    return [torch.tensor(selected, dtype=torch.int64).reshape(-1, 3)]
