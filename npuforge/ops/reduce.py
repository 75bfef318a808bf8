"""ReduceMean (axes as an input, opset 18 form; older attribute form converted at import)."""

import numpy as np

from .registry import Op, TensorInfo, const_ints, norm_axis, register


@register
class ReduceMean(Op):
    name = "ReduceMean"
    inputs = (1, 2)
    attrs = {"keepdims": 1, "noop_with_empty_axes": 0}
    onnx_only_attrs = ("axes",)
    summary = "mean over the given axes (all when none given), keepdims"
    quant = "pool"

    def from_onnx(self, ctx, node):
        axes = node.attrs.pop("axes", None)
        if axes is not None:
            node.inputs = [node.inputs[0], ctx.add_const(f"{node.name}_axes", np.array(axes, np.int64))]

    def axes(self, node, ins) -> list | None:
        rank = len(ins[0].shape)
        axes = const_ints(node, ins[1], "axes") if len(ins) > 1 else None
        if not axes:
            return None if node.attrs["noop_with_empty_axes"] else list(range(rank))
        return sorted(norm_axis(node, a, rank) for a in axes)

    def infer(self, node, ins):
        x = ins[0]
        axes = self.axes(node, ins)
        if axes is None:
            return [TensorInfo(x.dtype, x.shape)]
        keep = node.attrs["keepdims"]
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
        return [TensorInfo(x.dtype, shape)]

    def forward(self, node, xs):
        x = xs[0]
        axes = None
        if len(xs) > 1 and xs[1] is not None and xs[1].numel():
            axes = [int(a) % x.dim() for a in xs[1].tolist()]
        elif not node.attrs["noop_with_empty_axes"]:
            axes = list(range(x.dim()))
        if axes is None:
            return [x]
        return [x.mean(dim=axes, keepdim=bool(node.attrs["keepdims"]))]
