"""Ops of shape subgraphs: Shape, Size, Gather, Cast, ConstantOfShape, Range.

Their values propagate at import, symbolic dims included, so the Reshape or
Pad they feed gets a static target.
"""

import math

import numpy as np
import onnx.numpy_helper
import torch

from ..ir import dtypes
from .dtype_rules import require_dtype
from .registry import (
    REQUIRED, Op, Structural, TensorInfo, const_ints, dim_product, fail, norm_axis, register, static_dims, unsupported,
)


@register
class Shape(Op):
    name = "Shape"
    attrs = {"start": 0, "end": None}
    summary = "the input's shape as int64[rank] (start/end window)"
    quant = "shape"

    def window(self, node, rank):
        start, end = node.attrs["start"], node.attrs["end"]
        return slice(*slice(start, rank if end is None else end).indices(rank)[:2])

    def infer(self, node, ins):
        shape = ins[0].shape
        return [TensorInfo("int64", (len(shape[self.window(node, len(shape))]),))]

    def propagate(self, node, ins, outs):
        dims = ins[0].shape[self.window(node, len(ins[0].shape))]
        if all(isinstance(d, int) for d in dims):
            return [np.array(dims, np.int64)]
        return [np.array(list(dims), dtype=object)]

    def forward(self, node, xs):
        shape = tuple(xs[0].shape)
        return [torch.tensor(shape[self.window(node, len(shape))], dtype=torch.int64)]


@register
class Size(Op):
    name = "Size"
    summary = "the input's element count as an int64 scalar"
    quant = "shape"

    def infer(self, node, ins):
        return [TensorInfo("int64", ())]

    def propagate(self, node, ins, outs):
        count = dim_product(ins[0].shape)  # 'N*12' when a dim is symbolic
        if isinstance(count, int):
            return [np.array(count, np.int64)]
        return [np.array(count, dtype=object)]

    def forward(self, node, xs):
        return [torch.tensor(xs[0].numel(), dtype=torch.int64)]


@register
class Gather(Structural):
    name = "Gather"
    inputs = (2, 2)
    attrs = {"axis": 0}
    summary = "take entries along axis at int indices (negative indices count from the end)"
    quant = "passthrough"

    def infer(self, node, ins):
        data, idx = ins
        if idx.dtype not in ("int32", "int64"):
            fail(node, f"indices must be int32 or int64, got {idx.dtype}")
        axis = norm_axis(node, node.attrs["axis"], len(data.shape))
        size = data.shape[axis]
        if idx.value is not None and isinstance(size, int) and np.asarray(idx.value).size:
            values = np.asarray(idx.value).astype(np.int64)
            if values.min() < -size or values.max() >= size:
                bad = int(values.max() if values.max() >= size else values.min())
                fail(node, f"index {bad} is out of range for axis {axis} of size {size}")
        return [TensorInfo(data.dtype, (*data.shape[:axis], *idx.shape, *data.shape[axis + 1:]))]

    def np_forward(self, node, values, outs):
        return [np.take(values[0], values[1].astype(np.int64), axis=node.attrs["axis"])]

    def forward(self, node, xs):
        data, idx = xs
        axis = node.attrs["axis"] % data.dim()
        idx = idx.to(torch.int64)
        idx = torch.where(idx < 0, idx + data.shape[axis], idx)
        flat = data.index_select(axis, idx.reshape(-1))
        return [flat.reshape((*data.shape[:axis], *idx.shape, *data.shape[axis + 1:]))]


@register
class Cast(Structural):
    name = "Cast"
    attrs = {"to": REQUIRED, "saturate": 1}
    summary = "convert the element type (float to int truncates toward zero)"
    quant = "shape"

    def from_onnx(self, ctx, node):
        node.attrs["to"] = dtypes.from_onnx(node.attrs["to"], f"node '{node.name}' (Cast)")

    def infer(self, node, ins):
        return [TensorInfo(dtypes.check_dtype(node.attrs["to"]), ins[0].shape)]

    def np_forward(self, node, values, outs):
        v = values[0]
        if v.dtype == object and node.attrs["to"] in ("int32", "int64"):
            return [v]  # symbolic dims stay symbolic
        if v.dtype == object:
            return None
        return [v.astype(dtypes.to_numpy(node.attrs["to"]))]

    def propagate(self, node, ins, outs):
        out = super().propagate(node, ins, outs)
        return None if out is None or out[0] is None else out

    def forward(self, node, xs):
        return [xs[0].to(dtypes.to_torch(node.attrs["to"]))]

    def onnx_nodes(self, node):
        from onnx import helper

        return [helper.make_node("Cast", node.inputs, node.outputs, name=node.name,
                                 to=dtypes.to_onnx(node.attrs["to"]), saturate=node.attrs["saturate"])]


@register
class ConstantOfShape(Op):
    name = "ConstantOfShape"
    attrs = {"value": 0.0, "dtype": "float32"}
    attr_kinds = {"value": None}  # ONNX gives a one-element tensor, the IR its number (int, float or bool)
    summary = "a tensor of the given (static) shape filled with one value"
    quant = "shape"

    def from_onnx(self, ctx, node):
        tensor = node.attrs.get("value")
        if isinstance(tensor, onnx.TensorProto):
            arr = onnx.numpy_helper.to_array(tensor).reshape(-1)
            node.attrs["dtype"] = dtypes.from_numpy(arr.dtype)
            node.attrs["value"] = arr[0].item() if arr.size else 0

    def infer(self, node, ins):
        shape = const_ints(node, ins[0], "shape")
        static_dims(node, shape, "the requested")
        return [TensorInfo(dtypes.check_dtype(node.attrs["dtype"]), tuple(shape))]

    def onnx_nodes(self, node):
        from onnx import helper

        value = np.array([node.attrs["value"]], dtypes.to_numpy(node.attrs["dtype"]))
        return [helper.make_node("ConstantOfShape", node.inputs, node.outputs, name=node.name,
                                 value=onnx.numpy_helper.from_array(value))]

    def forward(self, node, xs):
        shape = [int(d) for d in xs[0].tolist()]
        return [torch.full(shape, node.attrs["value"], dtype=dtypes.to_torch(node.attrs["dtype"]))]


@register
class Range(Op):
    name = "Range"
    inputs = (3, 3)
    summary = "start + i * delta for i < max(ceil((limit - start) / delta), 0); the bounds known at import"
    quant = "shape"

    @staticmethod
    def count(start, limit, delta) -> int:
        """ONNX's element count; the bounds are numpy scalars of the op's dtype."""
        if np.issubdtype(start.dtype, np.integer):
            return max(-(-(int(limit) - int(start)) // int(delta)), 0)  # exact integer ceil
        # limit - start in the op's precision, the quotient in double (as ONNX Runtime computes it)
        return max(math.ceil(float(limit - start) / float(delta)), 0)

    def infer(self, node, ins):
        dtype = ins[0].dtype
        require_dtype(node, ins[0], ("int16", "int32", "int64", "float32", "float64"), "start")
        bounds = []
        for what, info in zip(("start", "limit", "delta"), ins):
            if info.dtype != dtype:
                fail(node, f"{what} is {info.dtype}, start is {dtype}")
            if len(info.shape) > 1 or (info.shape and info.shape[0] != 1):
                fail(node, f"{what} must be a scalar, got shape {list(info.shape)}")
            if info.value is None or info.value.dtype == object:
                unsupported(node, f"{what} must be known when the graph is imported (it sets the output length)")
            bounds.append(np.asarray(info.value).reshape(-1)[0])
        if bounds[2] == 0:
            fail(node, "delta is 0")
        return [TensorInfo(dtype, (self.count(*bounds),))]

    def forward(self, node, xs):
        start, limit, delta = (x.reshape(-1)[0] for x in xs)
        n = self.count(*(x.numpy() for x in (start, limit, delta)))
        # output[i] = start + i * delta in the op's dtype, as ONNX writes it (not a running sum)
        return [start + torch.arange(n, dtype=start.dtype) * delta]
