"""Reductions over axes given as an input (the opset 18 form; the older
attribute form is converted at import): ReduceMean, ReduceSum,
ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp,
ReduceProd, ReduceMax, ReduceMin. And CumSum.

Each reduction is an elementwise step before (square, |x|), the reduction
over the axes, and a step after (sqrt, log). With no axes and
noop_with_empty_axes=1 only the reduction itself is skipped: ReduceSumSquare
still squares, ReduceLogSum still takes the log (the opset 18 wording, which
ONNX Runtime follows).
"""

import numpy as np
import torch

from .dtype_rules import FLOAT, INDEX, REDUCIBLE, require_dtype
from .registry import Op, TensorInfo, const_ints, fail, norm_axis, register, unsupported


class _Reduce(Op):
    inputs = (1, 2)
    attrs = {"keepdims": 1, "noop_with_empty_axes": 0}
    onnx_only_attrs = ("axes",)  # opsets before 18 give axes as an attribute
    dtypes = REDUCIBLE
    # integers give exact results (no sqrt, log or division whose rounding ONNX leaves open)
    integer_exact = True

    def from_onnx(self, ctx, node):
        axes = node.attrs.pop("axes", None)
        if axes is not None:
            node.inputs = [node.inputs[0], ctx.add_const(f"{node.name}_axes", np.array(axes, np.int64))]

    def axes(self, node, ins) -> list:
        """The reduced axes, sorted; [] when the reduction is skipped (noop_with_empty_axes)."""
        rank = len(ins[0].shape)
        axes = const_ints(node, ins[1], "axes") if len(ins) > 1 else None
        if not axes:
            return [] if node.attrs["noop_with_empty_axes"] else list(range(rank))
        axes = sorted(norm_axis(node, a, rank) for a in axes)
        if len(set(axes)) != len(axes):
            fail(node, f"axes {axes} repeat")
        return axes

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, self.dtypes)
        if x.dtype not in FLOAT and not self.integer_exact:
            unsupported(node, f"{x.dtype} input: ONNX leaves the rounding of an integer {self.name} open")
        axes = self.axes(node, ins)
        keep = node.attrs["keepdims"]
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
        return [TensorInfo(x.dtype, shape)]

    def before(self, x):
        return x

    def reduce(self, x, axes: list, keep: bool):
        raise NotImplementedError

    def after(self, y):
        return y

    def forward(self, node, xs):
        x = xs[0]
        axes = []
        if len(xs) > 1 and xs[1] is not None and xs[1].numel():
            axes = sorted(int(a) % x.dim() for a in xs[1].tolist())
        elif not node.attrs["noop_with_empty_axes"]:
            axes = list(range(x.dim()))
        y = self.before(x)
        if axes:
            y = self.reduce(y, axes, bool(node.attrs["keepdims"]))
        return [self.after(y)]


@register
class ReduceMean(_Reduce):
    name = "ReduceMean"
    summary = "mean over the given axes (all when none given), keepdims"
    quant = "pool"
    integer_exact = False

    def reduce(self, x, axes, keep):
        return x.mean(dim=axes, keepdim=keep)


@register
class ReduceSum(_Reduce):
    name = "ReduceSum"
    onnx_only_attrs = ()  # axes is an input since opset 13
    summary = "sum over the given axes (all when none given), keepdims; int32/int64 too"
    quant = "pool"  # as ReduceMean, with a divisor of 1

    def quant_kind(self, node, graph):
        if graph.values[node.outputs[0]].dtype not in ("float16", "float32", "float64"):
            return "shape"
        return self.quant

    def reduce(self, x, axes, keep):
        return x.sum(dim=axes, keepdim=keep, dtype=x.dtype)  # torch would widen int32 to int64


@register
class ReduceSumSquare(ReduceSum):
    name = "ReduceSumSquare"
    quant = None  # not a plain sum
    onnx_only_attrs = ("axes",)
    summary = "sum of squares over the given axes, keepdims; int32/int64 too"

    def before(self, x):
        return x * x


@register
class ReduceL1(ReduceSum):
    name = "ReduceL1"
    quant = None  # not a plain sum
    onnx_only_attrs = ("axes",)
    summary = "sum of |x| over the given axes, keepdims; int32/int64 too"

    def before(self, x):
        return x.abs()


@register
class ReduceL2(ReduceSumSquare):
    name = "ReduceL2"
    summary = "sqrt of the sum of squares over the given axes, keepdims; float only"
    integer_exact = False

    def after(self, y):
        return torch.sqrt(y)


@register
class ReduceLogSum(ReduceSum):
    name = "ReduceLogSum"
    quant = None  # not a plain sum
    onnx_only_attrs = ("axes",)
    summary = "log of the sum over the given axes, keepdims; float only"
    integer_exact = False

    def after(self, y):
        return torch.log(y)


@register
class ReduceLogSumExp(_Reduce):
    name = "ReduceLogSumExp"
    summary = "log of the sum of exp over the given axes (computed stably), keepdims; float only"
    integer_exact = False

    def reduce(self, x, axes, keep):
        return torch.logsumexp(x, dim=axes, keepdim=keep)


@register
class ReduceProd(_Reduce):
    name = "ReduceProd"
    summary = "product over the given axes, keepdims; int32/int64 too"

    def reduce(self, x, axes, keep):
        for a in reversed(axes):  # torch's prod takes one axis; the highest first keeps the others' numbers
            x = x.prod(dim=a, keepdim=keep, dtype=x.dtype)
        return x


@register
class ReduceMax(_Reduce):
    name = "ReduceMax"
    dtypes = REDUCIBLE + ("uint8", "int8", "bool")  # opset 18 adds the 8-bit types, 20 bool
    summary = "maximum over the given axes, keepdims; integers and bool too"
    quant = "passthrough"  # selects a value: the output shares the input's parameters

    def reduce(self, x, axes, keep):
        return torch.amax(x, dim=axes, keepdim=keep)


@register
class ReduceMin(ReduceMax):
    name = "ReduceMin"
    summary = "minimum over the given axes, keepdims; integers and bool too"

    def reduce(self, x, axes, keep):
        return torch.amin(x, dim=axes, keepdim=keep)


@register
class CumSum(Op):
    name = "CumSum"
    inputs = (2, 2)
    attrs = {"exclusive": 0, "reverse": 0}
    summary = "running sum along an axis (known at import); exclusive, reverse; int32/int64 too"

    def infer(self, node, ins):
        x, axis = ins
        require_dtype(node, x, REDUCIBLE)
        require_dtype(node, axis, INDEX, "axis")
        value = const_ints(node, axis, "axis")
        if len(value) != 1:
            fail(node, f"axis must hold one value, got {value}")
        norm_axis(node, value[0], len(x.shape))
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x = xs[0]
        axis = int(xs[1].reshape(-1)[0]) % x.dim()
        reverse = node.attrs["reverse"]
        if reverse:
            x = x.flip(axis)
        y = torch.cumsum(x, axis, dtype=x.dtype)
        if node.attrs["exclusive"] and y.shape[axis]:
            # shift by one place, so each sum leaves out its own element (y - x would round differently)
            y = torch.cat([torch.zeros_like(y.narrow(axis, 0, 1)), y.narrow(axis, 0, y.shape[axis] - 1)], axis)
        return [y.flip(axis) if reverse else y]
