"""Building blocks shared by the zoo models.

TF-style "same" padding is resolved statically for the configured input size:
a symmetric amount becomes Conv2d's own ``padding=`` (no extra ONNX node); an
asymmetric one becomes one ``StaticZeroPad2d`` (an ``nn.ZeroPad2d`` that exports
as a single ONNX Pad with constant pads). Nothing is computed from the runtime shape, so the exported graph holds
no Shape/Slice/Pad chains.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def tf_same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """(before, after) padding of TensorFlow's SAME mode along one axis of length ``size``."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def same_out_size(size: int, stride: int) -> int:
    return math.ceil(size / stride)


class _ConstantPad(torch.autograd.Function):
    """F.pad whose ONNX export is one Pad node with a constant ``pads`` input.

    torch's own symbolic for ``constant_pad_nd`` computes the pads at run time
    (ConstantOfShape/Concat/Reshape/Slice/Transpose/Cast before the Pad), which
    an NPU toolchain should not have to fold.
    """

    @staticmethod
    def forward(ctx, x, pads):
        ctx.pads = pads
        return F.pad(x, pads)

    @staticmethod
    def backward(ctx, grad):
        return F.pad(grad, tuple(-p for p in ctx.pads)), None

    @staticmethod
    def symbolic(g, x, pads):
        left, right, top, bottom = pads
        onnx_pads = g.op("Constant", value_t=torch.tensor([0, 0, top, left, 0, 0, bottom, right], dtype=torch.int64))
        return g.op("Pad", x, onnx_pads, mode_s="constant")


class StaticZeroPad2d(nn.ZeroPad2d):
    """nn.ZeroPad2d that exports as a single ONNX Pad with constant pads."""

    def forward(self, x):
        if torch.onnx.is_in_onnx_export():
            return _ConstantPad.apply(x, tuple(self.padding))
        return F.pad(x, self.padding)


class ConvBNAct(nn.Sequential):
    """[ZeroPad2d] -> Conv2d (no bias) -> BatchNorm2d -> [activation].

    ``same_size``: when given (H, W), TF "same" padding for that input size;
    otherwise PyTorch symmetric padding ``(k - 1) // 2``.
    Children are named ``pad`` (only when asymmetric), ``conv``, ``bn``, ``act``.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, *,
                 act: type[nn.Module] | None = nn.ReLU, same_size: tuple[int, int] | None = None,
                 bn_eps: float = 1e-5, bn_momentum: float = 0.1):
        super().__init__()
        if same_size is not None:
            ph, pw = tf_same_pads(same_size[0], kernel, stride), tf_same_pads(same_size[1], kernel, stride)
            if ph[0] == ph[1] and pw[0] == pw[1]:
                padding = (ph[0], pw[0])
            else:
                self.pad = StaticZeroPad2d((pw[0], pw[1], ph[0], ph[1]))
                padding = 0
        else:
            padding = (kernel - 1) // 2
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=bn_eps, momentum=bn_momentum)
        if act is not None:
            self.act = act(inplace=True) if act in (nn.ReLU, nn.ReLU6) else act()


class DropPath(nn.Module):
    """Stochastic depth on the residual branch (training only; identity in eval and export)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device) < keep
        return x * mask.to(x.dtype) / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round channels to a multiple of ``divisor``, never more than 10 % below ``v``."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return int(new_v)


def init_weights(model: nn.Module, linear_init) -> None:
    """The usual zoo initialisation in one pass over the modules: Kaiming-normal
    (fan_out, ReLU gain) convolutions, BatchNorm to identity, and ``linear_init(m)``
    for each nn.Linear (the recipes differ there)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            linear_init(m)
