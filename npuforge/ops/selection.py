"""Ops that pick elements by value: TopK, ArgMax, ArgMin, NonMaxSuppression.

Ties follow ONNX: the lower index first (TopK, both directions; ArgMax /
ArgMin unless select_last_index). Their outputs include int64 indices, so only
NonMaxSuppression has a quantization rule: integer NMS on the codes of its
inputs, its output the same int64 indices (quant/nms_rule.py).
"""

import re

import numpy as np
import torch

from .dtype_rules import NUMERIC, require_dtype
from .registry import Op, TensorInfo, const_ints, fail, norm_axis, register


@register
class TopK(Op):
    name = "TopK"
    inputs = (2, 2)
    outputs = (2, 2)
    attrs = {"axis": -1, "largest": 1, "sorted": 1}
    summary = "the K largest / smallest along an axis and their int64 indices, ties by lower index; K known at import"

    def infer(self, node, ins):
        x, k = ins
        require_dtype(node, x, NUMERIC)
        require_dtype(node, k, ("int64",), "K")
        ks = const_ints(node, k, "K")
        if len(ks) != 1 or ks[0] < 0:
            fail(node, f"K {ks} should be one non-negative number")
        axis = norm_axis(node, node.attrs["axis"], len(x.shape))
        dim = x.shape[axis]
        if isinstance(dim, int) and ks[0] > dim:
            fail(node, f"K {ks[0]} exceeds the {dim} elements of axis {axis}")
        shape = tuple(ks[0] if i == axis else d for i, d in enumerate(x.shape))
        return [TensorInfo(x.dtype, shape), TensorInfo("int64", shape)]

    def forward(self, node, xs):
        x, k = xs[0], int(xs[1].reshape(-1)[0])
        axis = node.attrs["axis"] % x.dim()
        # a stable sort keeps equal values in index order, in either direction: ONNX's tie rule.
        # (With sorted=0 ONNX leaves the order open; sorted is one valid answer.)
        values, indices = torch.sort(x, dim=axis, descending=bool(node.attrs["largest"]), stable=True)
        return [values.narrow(axis, 0, k), indices.narrow(axis, 0, k)]


class _ArgReduce(Op):
    attrs = {"axis": 0, "keepdims": 1, "select_last_index": 0}

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, NUMERIC)
        axis = norm_axis(node, node.attrs["axis"], len(x.shape))
        keep = node.attrs["keepdims"]
        shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape) if keep or i != axis)
        return [TensorInfo("int64", shape)]

    def pick(self, x, axis: int):
        raise NotImplementedError

    def forward(self, node, xs):
        x = xs[0]
        axis = node.attrs["axis"] % x.dim()
        last = node.attrs["select_last_index"]
        # torch returns the first of equal extremes; the last one is the first of the reversed axis
        i = self.pick(x.flip(axis) if last else x, axis)
        if last:
            i = x.shape[axis] - 1 - i
        return [i.unsqueeze(axis) if node.attrs["keepdims"] else i]


@register
class ArgMax(_ArgReduce):
    name = "ArgMax"
    summary = "int64 index of the maximum along an axis (first, or last with select_last_index), keepdims"

    def pick(self, x, axis):
        return torch.argmax(x, dim=axis)


@register
class ArgMin(_ArgReduce):
    name = "ArgMin"
    summary = "int64 index of the minimum along an axis (first, or last with select_last_index), keepdims"

    def pick(self, x, axis):
        return torch.argmin(x, dim=axis)


def _scalar(xs, k, default, cast):
    t = xs[k] if len(xs) > k else None
    return default if t is None or not t.numel() else cast(t.reshape(-1)[0])


@register
class NonMaxSuppression(Op):
    name = "NonMaxSuppression"
    inputs = (2, 5)
    attrs = {"center_point_box": 0}
    summary = "greedy per batch and class by score, dropping IoU > iou_threshold with a kept box; int64 [n, 3]"

    def quant_kind(self, node, graph):
        """Integer NMS on the codes of quantized boxes and scores (quant/nms_rule.py)."""
        return "nms" if all(graph.values[i].dtype == "float32" for i in node.inputs[:2]) else None

    def quantize_integers(self, graph, node, add):
        from ..quant.nms_rule import quantize_integers

        quantize_integers(graph, node, add)

    def integer_forward(self, sim, node, env):
        from ..quant.nms_rule import integer_forward

        return integer_forward(sim, node, env)

    def from_onnx(self, ctx, node):
        if node.attrs["center_point_box"] not in (0, 1):
            fail(node, f"center_point_box {node.attrs['center_point_box']} is not 0 or 1")

    def infer(self, node, ins):
        boxes, scores = ins[:2]
        require_dtype(node, boxes, ("float32",), "boxes")
        require_dtype(node, scores, ("float32",), "scores")
        if len(boxes.shape) != 3 or (isinstance(boxes.shape[2], int) and boxes.shape[2] != 4):
            fail(node, f"boxes shape {list(boxes.shape)} should be [batches, boxes, 4]")
        if len(scores.shape) != 3:
            fail(node, f"scores shape {list(scores.shape)} should be [batches, classes, boxes]")
        for a, b, what in ((boxes.shape[0], scores.shape[0], "batches"), (boxes.shape[1], scores.shape[2], "boxes")):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                fail(node, f"boxes and scores disagree on the number of {what} ({a} vs {b})")
        for k, (what, dtype) in enumerate((("max_output_boxes_per_class", "int64"), ("iou_threshold", "float32"),
                                           ("score_threshold", "float32")), 2):
            if len(ins) > k and ins[k] is not None:
                require_dtype(node, ins[k], (dtype,), what)
                if len(ins[k].shape) > 1 or (ins[k].shape and ins[k].shape[0] != 1):
                    fail(node, f"{what} must be a scalar, got shape {list(ins[k].shape)}")
        # the count depends on the data: a dim of its own, named after the node
        return [TensorInfo("int64", (re.sub(r"\W", "_", node.name) + "_selected", 3))]

    @staticmethod
    def corners(boxes: np.ndarray, center_point_box: int) -> tuple:
        """float32 (x0, x1, y0, y1, area) of [N, 4] boxes, in ONNX Runtime's arithmetic."""
        if center_point_box:  # [x_center, y_center, width, height]
            half_w, half_h = boxes[:, 2] / np.float32(2), boxes[:, 3] / np.float32(2)
            x0, x1 = boxes[:, 0] - half_w, boxes[:, 0] + half_w
            y0, y1 = boxes[:, 1] - half_h, boxes[:, 1] + half_h
        else:  # [y1, x1, y2, x2], either corner first
            x0, x1 = np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3])
            y0, y1 = np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2])
        return x0, x1, y0, y1, (x1 - x0) * (y1 - y0)

    @staticmethod
    def overlapping(c: tuple, i: int, others: np.ndarray, iou_threshold: np.float32) -> np.ndarray:
        """Which of ``others`` box i suppresses: a positive overlap and areas, and an IoU strictly
        above the threshold (float32 throughout, as ONNX Runtime and the ONNX reference compute;
        every operation is symmetric in the two boxes, so either may be the kept one)."""
        x0, x1, y0, y1, area = c
        k = others
        ix0, ix1 = np.maximum(x0[i], x0[k]), np.minimum(x1[i], x1[k])
        iy0, iy1 = np.maximum(y0[i], y0[k]), np.minimum(y1[i], y1[k])
        inter = (ix1 - ix0) * (iy1 - iy0)
        union = area[i] + area[k] - inter
        ok = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area[i] > 0) & (area[k] > 0) & (union > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return ok & (inter / np.where(ok, union, np.float32(1)) > iou_threshold)

    def forward(self, node, xs):
        boxes, scores = xs[0].numpy(), xs[1].numpy()
        max_out = _scalar(xs, 2, 0, int)
        iou_threshold = np.float32(_scalar(xs, 3, 0.0, float))
        score_threshold = _scalar(xs, 4, None, float)
        selected = []
        # sequential by nature: each kept box decides the fate of the lower-scored ones, so a
        # kept box strikes out, at once, every lower one it overlaps too much
        for b in range(scores.shape[0]):
            c = self.corners(boxes[b], node.attrs["center_point_box"])
            for cls in range(scores.shape[1]):
                s = scores[b, cls]
                # highest score first, equal scores by lower box index (a stable sort)
                order = np.argsort(-s, kind="stable")
                if score_threshold is not None:
                    order = order[s[order] > score_threshold]
                alive, kept = np.ones(len(order), bool), []
                for rank in range(len(order)) if max_out > 0 else ():
                    if not alive[rank]:
                        continue
                    i = int(order[rank])
                    kept.append(i)
                    if len(kept) >= max_out:
                        break
                    alive[rank + 1:] &= ~self.overlapping(c, i, order[rank + 1:], iou_threshold)
                selected += [(b, cls, i) for i in kept]
        return [torch.tensor(selected, dtype=torch.int64).reshape(-1, 3)]
