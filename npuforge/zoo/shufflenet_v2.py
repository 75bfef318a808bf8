"""ShuffleNetV2 x1.0 (Ma et al. 2018); parameter names follow torchvision.

No weights ship with npuforge for this model (random init); a torchvision
``shufflenet_v2_x1_0`` checkpoint loads strictly with ``create_model(..., checkpoint=path)``.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import PretrainedConfig, register_model


def shuffle_permutation(channels: int, groups: int) -> torch.Tensor:
    """Channel order of a channel shuffle: the (groups, channels/groups) -> transposed layout."""
    return torch.arange(channels).view(groups, channels // groups).t().reshape(-1)


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """The textbook view/transpose/view form (for reference; the units use a static gather)."""
    b, c, h, w = x.shape
    x = x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(b, c, h, w)


def _dw(c: int, stride: int) -> nn.Conv2d:
    return nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.stride = stride
        bf = cout // 2
        self.split = bf
        # Split with constant sizes and a Gather with a constant permutation export as plain ONNX;
        # chunk() and view(b, g, c/g, h, w) would export shape arithmetic on the dynamic batch.
        self.register_buffer("shuffle", shuffle_permutation(cout, 2), persistent=False)
        if stride > 1:
            self.branch1 = nn.Sequential(_dw(cin, stride), nn.BatchNorm2d(cin), nn.Conv2d(cin, bf, 1, bias=False),
                                         nn.BatchNorm2d(bf), nn.ReLU(inplace=True))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(cin if stride > 1 else bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True),
            _dw(bf, stride), nn.BatchNorm2d(bf),
            nn.Conv2d(bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = torch.split(x, [self.split, self.split], dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return torch.index_select(out, 1, self.shuffle)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats=(4, 8, 4), channels=(24, 116, 232, 464, 1024), num_classes: int = 1000,
                 in_chans: int = 3):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(in_chans, channels[0], 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(channels[0]), nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = channels[0]
        for i, (n, cout) in enumerate(zip(repeats, channels[1:4]), start=2):
            setattr(self, f"stage{i}", nn.Sequential(InvertedResidual(cin, cout, 2),
                                                     *[InvertedResidual(cout, cout, 1) for _ in range(n - 1)]))
            cin = cout
        self.conv5 = nn.Sequential(nn.Conv2d(cin, channels[-1], 1, bias=False), nn.BatchNorm2d(channels[-1]),
                                   nn.ReLU(inplace=True))
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        x = self.conv5(self.stage4(self.stage3(self.stage2(x))))
        return self.fc(x.mean([2, 3]))


@register_model("shufflenet_v2_x1_0", PretrainedConfig(name="shufflenet_v2_x1_0", description="ShuffleNetV2 x1.0, 224x224"),
                head="fc")
def shufflenet_v2_x1_0(num_classes: int = 1000, in_chans: int = 3):
    return ShuffleNetV2(num_classes=num_classes, in_chans=in_chans)
