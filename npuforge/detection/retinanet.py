"""RetinaNet (Lin et al. 2017, "Focal Loss for Dense Object Detection") on MobileNetV2 + FPN.

Anchors: 9 per location (sizes 4 x stride times 2^0, 2^(1/3), 2^(2/3); height / width
ratios 0.5, 1, 2, ratio-major as torchvision orders them), centred on the cell centres
((i + 0.5) x stride, so P3's first anchors are centred at (4, 4)), not on torchvision's
cell corners (i x stride), and not rounded to integers as torchvision's base anchors are:
every anchor of a location shares that location's centre exactly.

Boxes: (dx, dy, dw, dh) deltas in torchvision's BoxCoder convention, weights (1, 1, 1, 1),
dw / dh clamped at log(1000 / 16) when decoding. Matching: IoU >= 0.5 positive, < 0.4
background, in between ignored, and each ground-truth box's best anchors (all ties, when
that IoU is above 0) positive too. Loss: sigmoid focal loss (alpha 0.25, gamma 2) summed
over the non-ignored anchors, plus L1 on the positives' deltas, each divided by the batch's
number of positives (at least 1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..zoo.registry import register_model
from .boxes import box_iou, decode_deltas, encode_deltas
from .fpn import (DEFAULT_IMAGE_SIZE, STRIDES, SYNTHETIC_CLASSES, DenseDetector, detector_config, level_sizes,
                  load_backbone_pretrained, sigmoid_focal_loss)

ANCHOR_SCALES = (1.0, 2 ** (1 / 3), 2 ** (2 / 3))
ANCHOR_RATIOS = (0.5, 1.0, 2.0)  # height / width
ANCHOR_BASE = 4  # base anchor size in strides: 32 on P3 ... 512 on P7
BACKGROUND, IGNORED = -1, -2  # match codes of anchors without a ground-truth box


def cell_anchors(stride: int) -> torch.Tensor:
    """The 9 anchors [9, 4] of one location centred at (0, 0), ratio-major then scale, float64."""
    rows = []
    for ratio in ANCHOR_RATIOS:
        for scale in ANCHOR_SCALES:
            size = ANCHOR_BASE * stride * scale
            w, h = size / math.sqrt(ratio), size * math.sqrt(ratio)  # area size^2, h / w = ratio
            rows.append((-w / 2, -h / 2, w / 2, h / 2))
    return torch.tensor(rows, dtype=torch.float64)


def anchor_grid(image_size) -> torch.Tensor:
    """All anchors [A, 4] xyxy float32 in forward's row order: level, row, column, anchor."""
    levels = []
    for (h, w), stride in zip(level_sizes(image_size), STRIDES):
        ys = (torch.arange(h, dtype=torch.float64) + 0.5) * stride
        xs = (torch.arange(w, dtype=torch.float64) + 0.5) * stride
        cy, cx = torch.meshgrid(ys, xs, indexing="ij")
        centres = torch.stack([cx, cy, cx, cy], -1)  # [h, w, 4]
        levels.append((centres[:, :, None, :] + cell_anchors(stride)[None, None]).reshape(-1, 4))
    return torch.cat(levels).float()


def match_anchors(gt_boxes: torch.Tensor, anchors: torch.Tensor, fg_iou: float = 0.5, bg_iou: float = 0.4,
                  low_quality: bool = True) -> torch.Tensor:
    """The ground-truth index of each anchor [A] (int64), or BACKGROUND / IGNORED.

    IoU >= ``fg_iou``: that box; < ``bg_iou``: background; in between: ignored. With
    ``low_quality``, the anchors of highest IoU with each box (ties included, IoU > 0) are
    positive too, for their own best box as in torchvision's Matcher, so no box goes
    unmatched only because no anchor reaches 0.5.
    """
    if len(gt_boxes) == 0:
        return torch.full((len(anchors),), BACKGROUND, dtype=torch.int64, device=anchors.device)
    iou = box_iou(gt_boxes, anchors)  # [M, A]
    best_iou, best_gt = iou.max(0)
    matches = best_gt.clone()
    matches[best_iou < fg_iou] = IGNORED
    matches[best_iou < bg_iou] = BACKGROUND
    if low_quality:
        best_per_gt = iou.max(1, keepdim=True).values
        anchor_index = torch.nonzero((iou == best_per_gt) & (best_per_gt > 0))[:, 1]
        matches[anchor_index] = best_gt[anchor_index]
    return matches


class RetinaNet(DenseDetector):
    """RetinaNet with a MobileNetV2 + FPN (P3-P7) backbone; see the module docstring.

    ``forward(x)`` -> (cls_logits [N, A, K], box_deltas [N, A, 4]), rows in :meth:`priors` order.
    """

    num_anchors = len(ANCHOR_SCALES) * len(ANCHOR_RATIOS)

    def __init__(self, num_classes: int = SYNTHETIC_CLASSES, image_size=DEFAULT_IMAGE_SIZE, fpn_channels: int = 64,
                 num_convs: int = 4, fg_iou: float = 0.5, bg_iou: float = 0.4):
        super().__init__(num_classes, image_size, fpn_channels, num_convs)
        self.output_widths = (num_classes, 4)
        self.fg_iou, self.bg_iou = fg_iou, bg_iou

    def priors(self, image_size=None) -> torch.Tensor:
        """The anchors [A, 4] xyxy (input pixels, float32), one per row of ``forward``."""
        return self._cached_priors(image_size, anchor_grid)

    def decode(self, outputs, image_size=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(boxes [N, A, 4] xyxy input pixels, scores [N, A, K] sigmoid) of ``forward``'s outputs."""
        size = self._size(image_size)
        anchors = self.priors(size)
        self._check_rows(outputs, len(anchors), size)
        cls_logits, deltas = outputs
        return decode_deltas(deltas, anchors.to(deltas.device)), torch.sigmoid(cls_logits)

    def match(self, gt_boxes: torch.Tensor, image_size=None) -> torch.Tensor:
        """Each anchor's ground-truth index, or BACKGROUND (-1) / IGNORED (-2)."""
        return match_anchors(gt_boxes, self.priors(image_size).to(gt_boxes.device), self.fg_iou, self.bg_iou)

    def loss(self, outputs, targets, image_size=None) -> dict:
        """{"classification", "box_regression", "loss"}: focal loss over non-ignored anchors and
        L1 on positives' deltas, each summed over the batch / its positives (at least 1)."""
        size = self._size(image_size)
        anchors = self.priors(size)
        self._check_rows(outputs, len(anchors), size)
        cls_logits, deltas = outputs
        anchors = anchors.to(deltas.device)
        cls_total = box_total = cls_logits.new_zeros(())
        positives = 0
        for i, (boxes, labels) in enumerate(self._check_targets(targets, len(cls_logits), deltas.device)):
            matches = match_anchors(boxes, anchors, self.fg_iou, self.bg_iou)
            positive = matches >= 0
            cls_target = torch.zeros_like(cls_logits[i])
            cls_target[positive] = F.one_hot(labels[matches[positive]], self.num_classes).to(cls_target.dtype)
            valid = matches != IGNORED
            cls_total = cls_total + sigmoid_focal_loss(cls_logits[i][valid], cls_target[valid]).sum()
            if positive.any():
                target_deltas = encode_deltas(boxes[matches[positive]], anchors[positive])
                box_total = box_total + (deltas[i][positive] - target_deltas).abs().sum()
            positives += int(positive.sum())
        norm = max(1, positives)
        losses = {"classification": cls_total / norm, "box_regression": box_total / norm}
        losses["loss"] = losses["classification"] + losses["box_regression"]
        return losses


@register_model("retinanet_mobilenet_v2_fpn",
                detector_config("retinanet_mobilenet_v2_fpn", "RetinaNet, MobileNetV2 + FPN P3-P7, 9 anchors, "
                                                              "160x160 (ImageNet backbone only)"),
                head="head.cls_logits", load_pretrained=load_backbone_pretrained, head_pretrained=False)
def retinanet_mobilenet_v2_fpn(num_classes: int = SYNTHETIC_CLASSES, image_size=DEFAULT_IMAGE_SIZE,
                               fpn_channels: int = 64, num_convs: int = 4, **kwargs):
    return RetinaNet(num_classes, image_size, fpn_channels, num_convs, **kwargs)
