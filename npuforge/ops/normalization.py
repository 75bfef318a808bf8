"""BatchNormalization in inference mode."""

import torch

from .registry import Op, TensorInfo, fail, register, unsupported


@register
class BatchNormalization(Op):
    name = "BatchNormalization"
    inputs = (5, 5)
    outputs = (1, 3)  # training-mode outputs are rejected at import
    attrs = {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}
    summary = "(x - mean) / sqrt(var + epsilon) * scale + B per channel (axis 1), inference mode"

    def from_onnx(self, ctx, node):
        if node.attrs["training_mode"]:
            unsupported(node, "training_mode=1 is not supported; export the model in eval mode")
        if len([o for o in node.outputs if o]) > 1:
            unsupported(node, "running mean/var outputs (training mode) are not supported")
        node.outputs = node.outputs[:1]

    def infer(self, node, ins):
        x = ins[0]
        if len(x.shape) < 2:
            fail(node, f"input rank {len(x.shape)} has no channel axis")
        c = x.shape[1]
        for what, p in zip(("scale", "B", "mean", "var"), ins[1:]):
            if len(p.shape) != 1 or (isinstance(c, int) and p.shape[0] != c):
                fail(node, f"{what} shape {list(p.shape)} should be [{c}]")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x, scale, bias, mean, var = xs
        view = (1, -1) + (1,) * (x.dim() - 2)
        mul = scale / torch.sqrt(var + node.attrs["epsilon"])
        return [(x - mean.reshape(view)) * mul.reshape(view) + bias.reshape(view)]
