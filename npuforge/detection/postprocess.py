"""A zoo RetinaNet or FCOS run as one graph with its post-processing: the head rows, then box
decoding, scores and class-wise non-maximum suppression as IR ops, so that the quantizer and
the integer simulator see the whole detector (as :mod:`npuforge.detection.blazeface` does
for BlazeFace).

* RetinaNet (``center_point_box=1``): ``(cx, cy) = (dx, dy) * anchor (w, h) + anchor centre``,
  ``(w, h) = exp(min((dw, dh), log(1000 / 16))) * anchor (w, h)``: Slice, Mul, Add, Clip,
  Exp, Mul, Concat; scores ``sigmoid(cls)``.
* FCOS (``center_point_box=0``, corners ``(x0, y0, x1, y1)``: IoU does not care which axis
  comes first): ``point - (l, t)`` and ``point + (r, b)``: Slice, Sub, Add, Concat; scores
  ``sigmoid(cls) * sigmoid(centerness)``, the square of ``model.detect``'s geometric mean (the
  same order, so the score threshold is squared and NMS keeps the same boxes).

NonMaxSuppression runs over every (prior, class) above the threshold, up to
``max_detections`` per class; :func:`detections` keeps the best ``max_detections`` of an
image and clips them to the image. ``model.detect`` differs in two details: it clips boxes
before NMS and takes the 1,000 best candidates first.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpuforgeError
from .boxes import DELTA_CLAMP


class Appender:
    """Nodes and constants added to a graph under one name prefix (the post-processing here and
    BlazeFace's)."""

    def __init__(self, graph, prefix: str):
        self.g, self.prefix, self.consts = graph, prefix, []

    def const(self, base: str, arr) -> str:
        name = self.g.add_const(self.g.unique_name(f"{self.prefix}/{base}"), np.asarray(arr)).name
        self.consts.append(name)
        return name

    def node(self, op: str, inputs, attrs=None, out: str | None = None) -> str:
        from ..ir.graph import Node, Value

        out = out or self.g.unique_name(f"{self.prefix}/{op.lower()}")
        self.g.add_value(Value(out, "float32", None))
        taken = {n.name for n in self.g.nodes}
        name, k = f"{self.prefix}/{op}", 1
        while name in taken:
            name, k = f"{self.prefix}/{op}_{k}", k + 1
        self.g.nodes.append(Node(name, op, list(inputs), [out], dict(attrs or {})))
        return out

    def slice(self, x: str, start: int, end: int, axis: int = 2) -> str:
        return self.node("Slice", [x, *(self.const(k, np.array([v], np.int64)) for k, v in
                                        (("starts", start), ("ends", end), ("axes", axis), ("steps", 1)))])


def head_path(graph, value: str) -> list[str]:
    """``value`` and the values before it back through the head's plumbing (Concat, Reshape,
    Transpose) to the convolutions that compute it."""
    producers = graph.producers()
    path, todo = [], [value]
    while todo:
        v = todo.pop()
        node = producers.get(v)
        if node is None or v in path:
            continue
        path.append(v)
        if node.op in ("Concat", "Reshape", "Transpose"):
            todo += [i for i in node.inputs if i in producers]
    return path


def postprocess_graph(graph, model, score_threshold: float = 0.05, iou_threshold: float = 0.5,
                      max_detections: int = 100):
    """``graph`` (the head rows of ``model`` exported at its input size: outputs cls_logits,
    boxes[, centerness]) with decoding, scores and NMS appended, in place. New outputs:
    ``decoded`` [N, P, 4], ``scores`` [N, K, P], ``selected`` [D, 3] (batch, class, prior).
    ``metadata["detector"]["int16"]``: the box path, from the regressor convolutions to
    ``decoded`` with its constants (anchors reach far beyond one 8-bit grid's precision)."""
    from ..ir.infer import infer_shapes

    names = list(model.output_names)
    if list(graph.outputs) != names:
        raise NpuforgeError(f"graph outputs {graph.outputs}: give a detector's head rows {names}")
    size = model.image_size
    a = Appender(graph, "postprocess")
    fcos = len(names) == 3
    if fcos:
        points, _ = model.priors(size)
        pts = points.numpy()[None].astype(np.float32)  # [1, P, 2]
        low = a.node("Sub", [a.const("points", pts), a.slice("boxes", 0, 2)])
        high = a.node("Add", [a.slice("boxes", 2, 4), a.const("points", pts)])
        decoded = a.node("Concat", [low, high], {"axis": 2}, out="decoded")
        probs = a.node("Mul", [a.node("Sigmoid", ["cls_logits"]), a.node("Sigmoid", ["centerness"])])
        threshold = score_threshold ** 2
    else:
        anchors = model.priors(size).numpy().astype(np.float64)
        wh = (anchors[:, 2:] - anchors[:, :2])[None].astype(np.float32)  # [1, A, 2]
        centre = ((anchors[:, :2] + anchors[:, 2:]) / 2)[None].astype(np.float32)
        cxcy = a.node("Add", [a.node("Mul", [a.slice("boxes", 0, 2), a.const("anchor_wh", wh)]),
                              a.const("anchor_centre", centre)])
        clamped = a.node("Clip", [a.slice("boxes", 2, 4), "", a.const("max_log_scale", np.float32(DELTA_CLAMP))])
        sizes = a.node("Mul", [a.node("Exp", [clamped]), a.const("anchor_wh", wh)])
        decoded = a.node("Concat", [cxcy, sizes], {"axis": 2}, out="decoded")
        probs = a.node("Sigmoid", ["cls_logits"])
        threshold = score_threshold
    scores = a.node("Transpose", [probs], {"perm": [0, 2, 1]}, out="scores")
    a.node("NonMaxSuppression", [decoded, scores, a.const("max_detections", np.array([max_detections], np.int64)),
                                 a.const("iou_threshold", np.array([iou_threshold], np.float32)),
                                 a.const("score_threshold", np.array([threshold], np.float32))],
           {"center_point_box": 0 if fcos else 1}, out="selected")
    graph.outputs = ["decoded", "scores", "selected"]
    infer_shapes(graph)
    graph.check()
    upstream = _upstream(graph, decoded)
    box_values = [v for n in graph.nodes if n.name.startswith("postprocess/") for v in n.outputs if v in upstream]
    consts = [c for c in a.consts if c in upstream and graph.values[c].dtype == "float32"]
    graph.metadata["detector"] = {
        "name": getattr(model, "zoo_name", type(model).__name__), "kind": "fcos" if fcos else "retinanet",
        "input_size": list(size), "score_threshold": score_threshold, "iou_threshold": iou_threshold,
        "max_detections": max_detections, "nms_score_threshold": threshold, "head_rows": names,
        "int16": head_path(graph, "boxes") + box_values + consts}
    return graph


def _upstream(graph, value: str) -> set[str]:
    """``value`` and every value it is computed from."""
    producers = graph.producers()
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        node = producers.get(v)
        todo += [i for i in node.inputs if i] if node is not None else []
    return seen


def detections(outputs: dict, kind: str, image_size, max_detections: int = 100) -> list[tuple]:
    """Per image of the batch: (boxes [D, 4] xyxy input pixels clipped to the image, scores
    [D] as ``model.detect`` scores, labels [D] int64), best first, at most ``max_detections``."""
    decoded = np.asarray(outputs["decoded"], np.float64)
    scores = np.asarray(outputs["scores"], np.float64)
    selected = np.asarray(outputs["selected"], np.int64).reshape(-1, 3)
    h, w = image_size
    results = []
    for b in range(decoded.shape[0]):
        rows = selected[selected[:, 0] == b]
        boxes = decoded[b, rows[:, 2]]
        s = scores[b, rows[:, 1], rows[:, 2]]
        if kind == "fcos":
            s = np.sqrt(s)
        else:  # centre, size -> corners
            boxes = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], axis=1)
        order = np.argsort(-s, kind="stable")[:max_detections]
        boxes = np.clip(boxes[order], 0, [w, h, w, h])
        results.append((boxes.astype(np.float32), s[order].astype(np.float32), rows[order, 1]))
    return results


__all__ = ["Appender", "detections", "head_path", "postprocess_graph"]
