"""Box arithmetic shared by the zoo detectors, in plain torch (no torchvision).

Boxes are ``[..., 4]`` tensors ``(x0, y0, x1, y1)`` in input pixels. Written once here so
RetinaNet's matcher and FCOS's GIoU loss, and both models' NMS, agree on what an
overlap is.
"""

from __future__ import annotations

import math

import torch

# torchvision's BoxCoder clamp: exp(dw) never scales an anchor by more than 1000 / 16
DELTA_CLAMP = math.log(1000.0 / 16)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box of ``a`` [N, 4] with every box of ``b`` [M, 4]: [N, M] (0 where both are empty)."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(a.dtype).tiny), torch.zeros_like(inter))


def generalized_iou(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """GIoU of aligned pairs ``a[i]``, ``b[i]`` ([N, 4] each): IoU minus the share of the
    enclosing box that neither covers, in [-1, 1]; ``1 - giou`` is the GIoU loss, in [0, 2]."""
    lt = torch.maximum(a[:, :2], b[:, :2])
    rb = torch.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = box_area(a) + box_area(b) - inter
    iou = inter / union.clamp(min=eps)
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).clamp(min=0).prod(-1)
    return iou - (hull - union) / hull.clamp(min=eps)


def encode_deltas(boxes: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Regression targets (dx, dy, dw, dh) of ``boxes`` against ``anchors`` ([..., 4] each),
    torchvision's BoxCoder convention with weights (1, 1, 1, 1): centre offsets in anchor
    widths / heights, log size ratios."""
    aw, ah = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
    ax, ay = anchors[..., 0] + 0.5 * aw, anchors[..., 1] + 0.5 * ah
    bw, bh = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    bx, by = boxes[..., 0] + 0.5 * bw, boxes[..., 1] + 0.5 * bh
    return torch.stack([(bx - ax) / aw, (by - ay) / ah, torch.log(bw / aw), torch.log(bh / ah)], -1)


def decode_deltas(deltas: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`encode_deltas` (``anchors`` broadcast against ``deltas``); dw and dh
    are clamped at log(1000 / 16) first, as torchvision does, so an untrained head cannot
    overflow exp."""
    aw, ah = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
    ax, ay = anchors[..., 0] + 0.5 * aw, anchors[..., 1] + 0.5 * ah
    cx, cy = deltas[..., 0] * aw + ax, deltas[..., 1] * ah + ay
    w = torch.exp(deltas[..., 2].clamp(max=DELTA_CLAMP)) * aw
    h = torch.exp(deltas[..., 3].clamp(max=DELTA_CLAMP)) * ah
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression: indices of the kept boxes, best score first.

    Boxes are visited by decreasing score (equal scores: lower index first); a box is
    dropped when its IoU with a box already kept exceeds ``iou_threshold``.
    """
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    overlaps = box_iou(boxes[order], boxes[order]) > iou_threshold
    suppressed = torch.zeros(len(order), dtype=torch.bool, device=boxes.device)
    kept = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        kept.append(i)
        suppressed |= overlaps[i]
    return order[torch.tensor(kept, dtype=torch.int64, device=boxes.device)]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Class-wise :func:`nms` (boxes of different labels never suppress each other): indices
    of the kept boxes, best score first (equal scores: lower index first)."""
    kept = [idx[nms(boxes[idx], scores[idx], iou_threshold)]
            for idx in (torch.nonzero(labels == c).flatten() for c in torch.unique(labels))]
    if not kept:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    kept = torch.cat(kept)
    kept = kept[torch.sort(kept).indices]  # index order first, so the stable sort below breaks ties by index
    return kept[torch.sort(scores[kept], descending=True, stable=True).indices]
