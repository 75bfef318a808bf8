"""FCOS (Tian et al. 2019, "FCOS: Fully Convolutional One-Stage Object Detection") on
MobileNetV2 + FPN.

Points: one per location, the cell centre (stride // 2 + stride * i). Regression: the
distances (left, top, right, bottom) to the box sides, ``ReLU(conv) * stride`` in input
pixels, the form of the FCOS authors' improved recipe: a ReLU and a constant Mul export and
quantize plainly, where the paper's ``exp(scale * x)`` needs an Exp whose int8 table spans
a huge range. No learnable per-level scale (it would be one more Mul per level).

Targets: a point is positive for a box when it lies inside the box and inside the box's
centre region (1.5 strides around the box centre, clipped to the box), and its largest
distance to the box sides falls in its level's range. The paper's ranges (0, 64), (64, 128),
(128, 256), (256, 512), (512, inf) are for ~800-pixel images; for the 160-pixel default the
ranges here are halved: (0, 32), (32, 64), (64, 128), (128, 256), (256, inf), i.e. up to 4
strides per level, which spreads the synthetic set's 16 to 72 pixel shapes over P3-P5
instead of piling them all on P3 (``size_ranges`` changes them). A point positive for
several boxes goes to the one of smallest area.

Loss: sigmoid focal loss (alpha 0.25, gamma 2) over all points / positives; GIoU loss on the
positives' boxes weighted by their centerness target / the sum of those weights; BCE of the
centerness logits against the target sqrt(min(l, r) / max(l, r) * min(t, b) / max(t, b)) on
positives / positives. Positives are counted over the batch (at least 1). Test-time score:
sqrt(sigmoid(class) * sigmoid(centerness)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import NpuforgeError
from ..zoo.registry import register_model
from .boxes import box_area, generalized_iou
from .fpn import (DEFAULT_IMAGE_SIZE, STRIDES, SYNTHETIC_CLASSES, DenseDetector, detector_config, level_sizes,
                  load_backbone_pretrained, sigmoid_focal_loss)

SIZE_RANGES = ((0.0, 32.0), (32.0, 64.0), (64.0, 128.0), (128.0, 256.0), (256.0, math.inf))
CENTER_RADIUS = 1.5  # centre sampling radius, in strides
BACKGROUND = -1


def point_grid(image_size) -> tuple[torch.Tensor, torch.Tensor]:
    """(points [P, 2] (x, y), strides [P]) float32 in forward's row order: level, row, column."""
    points, strides = [], []
    for (h, w), stride in zip(level_sizes(image_size), STRIDES):
        ys = torch.arange(h, dtype=torch.float32) * stride + stride // 2
        xs = torch.arange(w, dtype=torch.float32) * stride + stride // 2
        cy, cx = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack([cx, cy], -1).reshape(-1, 2))
        strides.append(torch.full((h * w,), float(stride)))
    return torch.cat(points), torch.cat(strides)


def ltrb_to(points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Distances (left, top, right, bottom) from each point [P, 2] to each box [M, 4]: [P, M, 4]."""
    x, y = points[:, 0, None], points[:, 1, None]
    return torch.stack([x - boxes[:, 0], y - boxes[:, 1], boxes[:, 2] - x, boxes[:, 3] - y], -1)


def assign_points(gt_boxes: torch.Tensor, points: torch.Tensor, strides: torch.Tensor, ranges: torch.Tensor,
                  radius: float = CENTER_RADIUS) -> torch.Tensor:
    """The ground-truth index of each point [P] (int64), or BACKGROUND.

    ``ranges`` [P, 2]: each point's (low, high) bound on its largest side distance.
    """
    if len(gt_boxes) == 0:
        return torch.full((len(points),), BACKGROUND, dtype=torch.int64, device=points.device)
    ltrb = ltrb_to(points, gt_boxes)  # [P, M, 4]
    inside_box = ltrb.min(-1).values > 0
    centre = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2  # [M, 2]
    reach = strides[:, None, None] * radius  # [P, 1, 1]
    region_lo = torch.maximum(centre[None] - reach, gt_boxes[None, :, :2])  # [P, M, 2]
    region_hi = torch.minimum(centre[None] + reach, gt_boxes[None, :, 2:])
    inside_centre = ((points[:, None] > region_lo) & (points[:, None] < region_hi)).all(-1)
    longest = ltrb.max(-1).values
    in_range = (longest >= ranges[:, None, 0]) & (longest <= ranges[:, None, 1])
    area = box_area(gt_boxes)[None].expand(len(points), -1)
    area = torch.where(inside_box & inside_centre & in_range, area, torch.full_like(area, math.inf))
    smallest, index = area.min(1)
    return torch.where(torch.isfinite(smallest), index, torch.full_like(index, BACKGROUND))


def centerness_target(ltrb: torch.Tensor) -> torch.Tensor:
    """sqrt(min(l, r) / max(l, r) * min(t, b) / max(t, b)) of [..., 4] distances: 1 at the box centre."""
    lr, tb = ltrb[..., 0::2], ltrb[..., 1::2]
    return torch.sqrt((lr.min(-1).values / lr.max(-1).values) * (tb.min(-1).values / tb.max(-1).values))


class FCOS(DenseDetector):
    """FCOS with a MobileNetV2 + FPN (P3-P7) backbone; see the module docstring.

    ``forward(x)`` -> (cls_logits [N, P, K], box_ltrb [N, P, 4] input pixels,
    centerness_logits [N, P, 1]), rows in :meth:`priors` order.
    """

    num_anchors = 1

    def __init__(self, num_classes: int = SYNTHETIC_CLASSES, image_size=DEFAULT_IMAGE_SIZE, fpn_channels: int = 64,
                 num_convs: int = 4, size_ranges=SIZE_RANGES, center_radius: float = CENTER_RADIUS):
        super().__init__(num_classes, image_size, fpn_channels, num_convs, centerness=True)
        self.output_widths = (num_classes, 4, 1)
        ranges = [tuple(float(v) for v in r) for r in size_ranges]
        if len(ranges) != len(STRIDES) or any(len(r) != 2 or not r[0] < r[1] for r in ranges):
            raise NpuforgeError(f"size_ranges={size_ranges!r}: give {len(STRIDES)} (low, high) pairs, low < high, "
                                f"one per level P3-P7")
        self.size_ranges = tuple(ranges)
        self.center_radius = float(center_radius)

    def level_outputs(self, level: int, p: torch.Tensor) -> tuple:
        cls, box, centerness = self.head(p)
        return cls, F.relu(box) * float(STRIDES[level]), centerness

    def priors(self, image_size=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(points [P, 2] (x, y) input pixels, strides [P]) float32, one per row of ``forward``."""
        return self._cached_priors(image_size, point_grid)

    def point_ranges(self, image_size=None) -> torch.Tensor:
        """Each point's (low, high) range [P, 2] of its largest side distance: its level's."""
        sizes = level_sizes(self._size(image_size))
        return torch.cat([torch.tensor([r], dtype=torch.float32).expand(h * w, 2)
                          for (h, w), r in zip(sizes, self.size_ranges)])

    def assign(self, gt_boxes: torch.Tensor, image_size=None) -> torch.Tensor:
        """Each point's ground-truth index, or BACKGROUND (-1)."""
        points, strides = (t.to(gt_boxes.device) for t in self.priors(image_size))
        return assign_points(gt_boxes, points, strides, self.point_ranges(image_size).to(gt_boxes.device),
                             self.center_radius)

    def decode(self, outputs, image_size=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(boxes [N, P, 4] xyxy input pixels, scores [N, P, K] = sqrt(sigmoid(cls) * sigmoid(centerness)))."""
        size = self._size(image_size)
        points, _ = self.priors(size)
        self._check_rows(outputs, len(points), size)
        cls_logits, ltrb, centerness = outputs
        points = points.to(ltrb.device)
        boxes = torch.cat([points - ltrb[..., :2], points + ltrb[..., 2:]], -1)
        return boxes, torch.sqrt(torch.sigmoid(cls_logits) * torch.sigmoid(centerness))

    def loss(self, outputs, targets, image_size=None) -> dict:
        """{"classification", "box_regression", "centerness", "loss"}; see the module docstring."""
        size = self._size(image_size)
        points, strides = self.priors(size)
        self._check_rows(outputs, len(points), size)
        cls_logits, ltrb, centerness = outputs
        device = ltrb.device
        points, strides, ranges = points.to(device), strides.to(device), self.point_ranges(size).to(device)
        cls_total = box_total = ctr_total = cls_logits.new_zeros(())
        positives, ctr_weight = 0, 0.0
        for i, (boxes, labels) in enumerate(self._check_targets(targets, len(cls_logits), device)):
            matches = assign_points(boxes, points, strides, ranges, self.center_radius)
            positive = matches >= 0
            cls_target = torch.zeros_like(cls_logits[i])
            cls_target[positive] = F.one_hot(labels[matches[positive]], self.num_classes).to(cls_target.dtype)
            cls_total = cls_total + sigmoid_focal_loss(cls_logits[i], cls_target).sum()
            if positive.any():
                gt = boxes[matches[positive]]
                at = points[positive]
                target_ltrb = torch.cat([at - gt[:, :2], gt[:, 2:] - at], -1)
                weight = centerness_target(target_ltrb)
                pred = ltrb[i][positive]
                pred_boxes = torch.cat([at - pred[:, :2], at + pred[:, 2:]], -1)
                box_total = box_total + ((1 - generalized_iou(pred_boxes, gt)) * weight).sum()
                ctr_total = ctr_total + F.binary_cross_entropy_with_logits(
                    centerness[i][positive, 0], weight, reduction="sum")
                ctr_weight += float(weight.sum())
            positives += int(positive.sum())
        norm = max(1, positives)
        losses = {"classification": cls_total / norm, "box_regression": box_total / max(ctr_weight, 1e-6),
                  "centerness": ctr_total / norm}
        losses["loss"] = losses["classification"] + losses["box_regression"] + losses["centerness"]
        return losses


@register_model("fcos_mobilenet_v2_fpn",
                detector_config("fcos_mobilenet_v2_fpn", "FCOS, MobileNetV2 + FPN P3-P7, centre sampling, "
                                                         "160x160 (ImageNet backbone only)"),
                head="head.cls_logits", load_pretrained=load_backbone_pretrained, head_pretrained=False)
def fcos_mobilenet_v2_fpn(num_classes: int = SYNTHETIC_CLASSES, image_size=DEFAULT_IMAGE_SIZE, fpn_channels: int = 64,
                          num_convs: int = 4, **kwargs):
    return FCOS(num_classes, image_size, fpn_channels, num_convs, **kwargs)
