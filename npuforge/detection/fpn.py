"""What the zoo's dense detectors share: a MobileNetV2 backbone, an FPN (P3-P7), a head
shared across levels, the flattening of its outputs, the focal loss and the post-processing.

RetinaNet (:mod:`.retinanet`) and FCOS (:mod:`.fcos`) differ only in their priors (anchors
or points), their target assignment, their box encoding and their losses.

Export: ``forward`` holds only Conv, Relu / Clip (MobileNetV2's ReLU6), Resize (nearest, a
constant 2x scale), Add, Mul by a constant (FCOS), Transpose, Reshape with constant shapes
and Concat. Nothing in it depends on data; the per-level grid sizes are constants of an
exported graph (only the batch axis may stay dynamic), which is what an NPU compiler wants.

The head is plain 3x3 conv + ReLU, without the GroupNorm of the FCOS papers: GroupNorm
normalises by statistics of each image at run time, which an int8 NPU cannot fold into a
convolution, and without normalisation the head quantizes like any other conv stack.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import NpuforgeError
from ..zoo.checkpoint import load_state_dict_strict, read_checkpoint
from ..zoo.mobilenet_v2 import WEIGHTS as MOBILENET_V2_WEIGHTS
from ..zoo.mobilenet_v2 import MobileNetV2
from ..zoo.registry import IMAGENET_MEAN, IMAGENET_STD, PretrainedConfig, weights_path
from .boxes import batched_nms

STRIDES = (8, 16, 32, 64, 128)  # P3 .. P7
SIZE_MULTIPLE = 32  # P5's stride: the top-down path upsamples P5 and P4 by exactly 2
DEFAULT_IMAGE_SIZE = 160
PRIOR_PROBABILITY = 0.01  # the focal-loss paper's initial foreground probability of every class
SYNTHETIC_CLASSES = 4  # square, circle, triangle, cross (npuforge.detection.synthetic)


def check_image_size(image_size) -> tuple[int, int]:
    """``image_size`` (an int or (height, width)) as (h, w); an NpuforgeError unless both are
    positive multiples of 32, the stride of P5 that the FPN doubles back onto P4 and P3."""
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if (len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)
            or any(s % SIZE_MULTIPLE for s in size)):
        raise NpuforgeError(f"image_size={image_size!r}: give a positive multiple of {SIZE_MULTIPLE} (or a pair), "
                            f"as the FPN upsamples P5 (stride {SIZE_MULTIPLE}) exactly 2x onto P4 and P3")
    return size


def level_sizes(image_size) -> list[tuple[int, int]]:
    """(rows, columns) of P3 .. P7 for an input size: P3-P5 divide it by 8, 16, 32; P6 and P7
    are 3x3 stride-2 convs with padding 1, so each halves the previous size rounding up."""
    h, w = check_image_size(image_size)
    sizes = [(h // s, w // s) for s in STRIDES[:3]]
    for _ in STRIDES[3:]:
        ph, pw = sizes[-1]
        sizes.append(((ph + 1) // 2, (pw + 1) // 2))
    return sizes


def detector_config(name: str, description: str) -> PretrainedConfig:
    """The registry entry of a zoo detector: MobileNetV2's ImageNet weights (backbone only),
    its mean / std, a small square input for CPU training and the synthetic set's 4 classes."""
    return PretrainedConfig(name=name, input_size=(3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE),
                            resize_size=DEFAULT_IMAGE_SIZE, crop_pct=1.0, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                            num_classes=SYNTHETIC_CLASSES, label_set="", weights=MOBILENET_V2_WEIGHTS,
                            description=description)


# layers of the MobileNetV2 checkpoint the backbone does not have: the classifier, and
# features.18, the 1x1 conv to 1280 channels that feeds only the classifier
_UNUSED_BACKBONE_KEYS = ("classifier.", "features.18.")


def load_backbone_pretrained(model: nn.Module, config: PretrainedConfig) -> None:
    """Load MobileNetV2's ImageNet checkpoint into ``model.backbone``, strictly: every backbone
    key must be in the file with its shape; only the layers the backbone drops are left out.
    The FPN and the head keep their initialisation."""
    path = weights_path(config)
    state = {k: v for k, v in read_checkpoint(path).items() if not k.startswith(_UNUSED_BACKBONE_KEYS)}
    load_state_dict_strict(model.backbone, state, where=str(path))


class MobileNetV2Features(nn.Module):
    """The zoo's MobileNetV2 ``features`` up to the last inverted residual (features[0..17]),
    returning C3, C4, C5: the outputs of features[6] (stride 8, 32 channels), features[13]
    (stride 16, 96) and features[17] (stride 32, 320). Parameter names are the classifier's
    (``features.N...``), so its checkpoint loads as it is."""

    TAPS = (6, 13, 17)
    CHANNELS = (32, 96, 320)

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(*list(MobileNetV2(num_classes=1).features)[:self.TAPS[-1] + 1])

    def forward(self, x):
        taps = []
        for index, layer in enumerate(self.features):
            x = layer(x)
            if index in self.TAPS:
                taps.append(x)
        return taps


class FeaturePyramid(nn.Module):
    """FPN: P3-P5 from 1x1 laterals of C3-C5, a nearest 2x top-down path added into them and
    3x3 output convs; P6 a 3x3 stride-2 conv on the P5 *output* (RetinaNet's paper uses C5;
    torchvision's and FCOS's "P5" variant use P5, which keeps P6 at the FPN's width and its
    input range the one of the other levels, simpler to quantize); P7 ReLU then 3x3 stride 2."""

    def __init__(self, in_channels=MobileNetV2Features.CHANNELS, channels: int = 64):
        super().__init__()
        self.laterals = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.outputs = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1) for _ in in_channels)
        self.p6 = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.p7 = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight, a=1)  # torchvision's FPN initialisation
                nn.init.zeros_(m.bias)

    def forward(self, feats):
        merged = [None] * len(feats)
        merged[-1] = self.laterals[-1](feats[-1])
        for i in range(len(feats) - 2, -1, -1):
            # a constant scale (not a target size) exports as one Resize with constant scales
            merged[i] = self.laterals[i](feats[i]) + F.interpolate(merged[i + 1], scale_factor=2.0, mode="nearest")
        pyramid = [conv(m) for conv, m in zip(self.outputs, merged)]
        p6 = self.p6(pyramid[-1])
        return pyramid + [p6, self.p7(F.relu(p6))]


def _tower(channels: int, num_convs: int) -> nn.Sequential:
    layers = []
    for _ in range(num_convs):
        layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


class DenseHead(nn.Module):
    """The head run on every pyramid level with the same weights: a classification tower and
    a box tower of ``num_convs`` 3x3 conv + ReLU each, then 3x3 convs to ``num_anchors * K``
    class logits and ``num_anchors * 4`` box values, and (FCOS) ``num_anchors`` centerness
    logits from the box tower. Plain conv + ReLU: see the module docstring."""

    def __init__(self, channels: int, num_anchors: int, num_classes: int, num_convs: int, centerness: bool = False):
        super().__init__()
        self.cls_tower = _tower(channels, num_convs)
        self.box_tower = _tower(channels, num_convs)
        self.cls_logits = nn.Conv2d(channels, num_anchors * num_classes, 3, padding=1)
        self.box_regression = nn.Conv2d(channels, num_anchors * 4, 3, padding=1)
        self.centerness = nn.Conv2d(channels, num_anchors, 3, padding=1) if centerness else None
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)
        # every class starts at probability 0.01, so the many background priors do not swamp
        # the focal loss (and the first steps) with confident false positives
        nn.init.constant_(self.cls_logits.bias, -math.log((1 - PRIOR_PROBABILITY) / PRIOR_PROBABILITY))

    def forward(self, p):
        cls = self.cls_logits(self.cls_tower(p))
        box_features = self.box_tower(p)
        box = self.box_regression(box_features)
        if self.centerness is None:
            return cls, box
        return cls, box, self.centerness(box_features)


def _static_grid(t: torch.Tensor) -> tuple[int, int]:
    """(H, W) of a feature map as Python ints. When tracing for ONNX they become constants of
    the graph, so each Reshape takes a constant shape even with a dynamic batch axis (the
    sizes follow from the fixed input size)."""
    if torch.jit.is_tracing():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return int(t.shape[2]), int(t.shape[3])
    return t.shape[2], t.shape[3]


def sigmoid_focal_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25,
                       gamma: float = 2.0) -> torch.Tensor:
    """Elementwise focal loss (Lin et al. 2017) of sigmoid ``logits`` against 0/1 ``targets``:
    binary cross-entropy scaled by (1 - p_t)^gamma and weighted alpha (foreground) or
    1 - alpha (background); torchvision's formula."""
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return alpha_t * ce * (1 - p_t) ** gamma


class DenseDetector(nn.Module):
    """Backbone -> FPN -> shared head; ``forward`` returns the head outputs of every level
    flattened to rows and concatenated, in the order level, row, column, anchor.

    Subclasses set ``num_anchors`` and ``output_widths`` (values per row of each output), and
    write ``priors``, ``decode`` and ``loss``; ``detect`` is common.
    """

    num_anchors = 1
    output_widths: tuple = ()

    @property
    def output_names(self) -> tuple[str, ...]:
        """The names of ``forward``'s outputs in an exported graph (RetinaNet: 2, FCOS: 3)."""
        return ("cls_logits", "boxes", "centerness")[:len(self.output_widths)]

    def __init__(self, num_classes: int, image_size, fpn_channels: int, num_convs: int, centerness: bool = False):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 1:
            raise NpuforgeError(f"num_classes={num_classes!r}: give a positive integer")
        if not isinstance(fpn_channels, int) or fpn_channels < 1:
            raise NpuforgeError(f"fpn_channels={fpn_channels!r}: give a positive integer")
        if not isinstance(num_convs, int) or num_convs < 0:
            raise NpuforgeError(f"num_convs={num_convs!r}: give a non-negative integer")
        self.num_classes = num_classes
        self.image_size = check_image_size(image_size)
        self.backbone = MobileNetV2Features()
        self.fpn = FeaturePyramid(MobileNetV2Features.CHANNELS, fpn_channels)
        self.head = DenseHead(fpn_channels, self.num_anchors, num_classes, num_convs, centerness)
        self._prior_cache: dict = {}

    # ------------------------------------------------------------------ network

    def level_outputs(self, level: int, p: torch.Tensor) -> tuple:
        """The head's maps [N, num_anchors * width, H, W] of one level (FCOS scales its boxes)."""
        return self.head(p)

    def forward(self, x):
        if not torch.jit.is_tracing():
            if x.ndim != 4 or x.shape[1] != 3:
                raise NpuforgeError(f"input of shape {list(x.shape)}: give images [N, 3, H, W]")
            if any(int(s) % SIZE_MULTIPLE for s in x.shape[2:]):
                raise NpuforgeError(f"input of shape {list(x.shape)}: height and width must be multiples of "
                                    f"{SIZE_MULTIPLE} (the FPN upsamples P5 exactly 2x onto P4 and P3)")
        pyramid = self.fpn(self.backbone(x))
        rows = [[] for _ in self.output_widths]
        for level, p in enumerate(pyramid):
            for out, t, width in zip(rows, self.level_outputs(level, p), self.output_widths):
                h, w = _static_grid(t)
                # [N, A * width, H, W] -> [N, H, W, A * width] -> [N, H * W * A, width]
                out.append(t.permute(0, 2, 3, 1).reshape(-1, h * w * self.num_anchors, width))
        return tuple(torch.cat(out, 1) for out in rows)

    # ------------------------------------------------------------------ helpers

    def _size(self, image_size) -> tuple[int, int]:
        return self.image_size if image_size is None else check_image_size(image_size)

    def _cached_priors(self, image_size, build):
        size = self._size(image_size)
        if size not in self._prior_cache:
            self._prior_cache[size] = build(size)
        return self._prior_cache[size]

    def _check_rows(self, outputs, count: int, size) -> None:
        if not isinstance(outputs, (tuple, list)) or len(outputs) != len(self.output_widths):
            raise NpuforgeError(f"outputs: give the {len(self.output_widths)} tensors forward returns")
        for t, width in zip(outputs, self.output_widths):
            if t.ndim != 3 or t.shape[1] != count or t.shape[2] != width:
                raise NpuforgeError(f"outputs of shape {list(t.shape)} do not fit image size {size[0]}x{size[1]} "
                                    f"({count} priors, {width} values each); pass the image_size forward ran at")

    def _check_targets(self, targets, batch: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each image's (boxes float [M, 4], labels int64 [M]) on ``device``, checked."""
        if not isinstance(targets, (list, tuple)) or len(targets) != batch:
            raise NpuforgeError(f"targets: give a list of {batch} dicts (one per image) with 'boxes' and 'labels'")
        checked = []
        for i, t in enumerate(targets):
            if not isinstance(t, dict) or "boxes" not in t or "labels" not in t:
                raise NpuforgeError(f"targets[{i}]: give a dict with 'boxes' [M, 4] and 'labels' [M]")
            boxes = torch.as_tensor(t["boxes"], dtype=torch.float32, device=device).reshape(-1, 4)
            labels = torch.as_tensor(t["labels"], device=device)
            if labels.dtype.is_floating_point or labels.shape != (len(boxes),):
                raise NpuforgeError(f"targets[{i}]: labels of shape {list(labels.shape)} and dtype {labels.dtype} "
                                    f"for {len(boxes)} boxes; give integers [M]")
            labels = labels.long()
            if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
                raise NpuforgeError(f"targets[{i}]: labels must be in 0..{self.num_classes - 1}, "
                                    f"got {int(labels.min())}..{int(labels.max())}")
            if len(boxes) and not bool(((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).all()):
                raise NpuforgeError(f"targets[{i}]: every box needs x1 > x0 and y1 > y0 (xyxy input pixels)")
            checked.append((boxes, labels))
        return checked

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def detect(self, inputs, score_threshold: float = 0.05, iou_threshold: float = 0.5, max_detections: int = 100,
               image_size=None, candidates: int = 1000) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per image (boxes [D, 4] xyxy clipped to the image, scores [D], labels [D] int64),
        best first. ``inputs``: images [N, 3, H, W] (run through the model as it is, train or
        eval mode) or the outputs of ``forward`` at ``image_size`` (default the model's).
        The ``candidates`` best (prior, class) pairs above ``score_threshold`` per image go
        to class-wise greedy NMS; the first ``max_detections`` survivors are returned."""
        if isinstance(inputs, torch.Tensor):
            image_size = tuple(int(s) for s in inputs.shape[2:])
            inputs = self(inputs)
        size = self._size(image_size)
        boxes, scores = self.decode(inputs, size)
        results = []
        for image_boxes, image_scores in zip(boxes, scores):
            flat = image_scores.flatten()
            index = torch.nonzero(flat > score_threshold).flatten()
            if len(index) > candidates:
                index = index[torch.topk(flat[index], candidates).indices]
            prior, label = index // self.num_classes, index % self.num_classes
            kept_boxes = image_boxes[prior]
            kept_boxes = torch.stack([kept_boxes[:, 0].clamp(0, size[1]), kept_boxes[:, 1].clamp(0, size[0]),
                                      kept_boxes[:, 2].clamp(0, size[1]), kept_boxes[:, 3].clamp(0, size[0])], 1)
            keep = batched_nms(kept_boxes, flat[index], label, iou_threshold)[:max_detections]
            results.append((kept_boxes[keep], flat[index][keep], label[keep]))
        return results
