"""Index-driven reads and writes: GatherElements, GatherND, ScatterElements,
ScatterND, OneHot.

Negative indices count from the end of their axis everywhere (ONNX allows
them in all five); an index out of range is an error at run time. The gathers
only select values ("passthrough" when quantized); the scatters combine two
tensors and OneHot makes new ones, so they have no quantization rule.
"""

import numpy as np
import torch

from .dtype_rules import ANY, INDEX, NUMERIC, require_dtype
from .registry import Op, TensorInfo, fail, norm_axis, register, unsupported

_REDUCTIONS = ("none", "add", "mul", "max", "min")
_TORCH_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}


def _wrap(idx: torch.Tensor, size) -> torch.Tensor:
    """int64 indices with negative ones counted from the end (size: an int or a tensor that broadcasts)."""
    idx = idx.to(torch.int64)
    return torch.where(idx < 0, idx + size, idx)


def _check_reduction(node, data_dtype: str | None = None) -> None:
    r = node.attrs["reduction"]
    if r not in _REDUCTIONS:
        unsupported(node, f"reduction {r!r} is not one of {', '.join(_REDUCTIONS)}")
    if data_dtype == "bool" and r != "none":
        unsupported(node, f"reduction {r!r} on bool data")


def _fits(node, idx_shape, data_shape, axis, what: str) -> None:
    """Index tensors of the element-wise ops have the data's rank and, off the axis, no larger dims."""
    if len(idx_shape) != len(data_shape):
        fail(node, f"{what} rank {len(idx_shape)} differs from the data's {len(data_shape)}")
    for k, (i, d) in enumerate(zip(idx_shape, data_shape)):
        if k != axis and isinstance(i, int) and isinstance(d, int) and i > d:
            fail(node, f"{what} shape {list(idx_shape)} exceeds the data shape {list(data_shape)} on axis {k}")


def _linear_index(idx: torch.Tensor, dims) -> torch.Tensor:
    """[..., k] indices into the leading k dims ``dims`` -> [...] row-major offsets."""
    size = torch.tensor(dims, dtype=torch.int64)
    idx = _wrap(idx, size)
    strides = [int(np.prod(dims[j + 1:], dtype=np.int64)) for j in range(len(dims))]
    return (idx * torch.tensor(strides, dtype=torch.int64)).sum(dim=-1)


@register
class GatherElements(Op):
    name = "GatherElements"
    inputs = (2, 2)
    attrs = {"axis": 0}
    summary = "y[i][j] = x[idx[i][j]][j] along axis (torch.gather); output has the indices' shape"
    quant = "passthrough"

    def infer(self, node, ins):
        data, idx = ins
        require_dtype(node, idx, INDEX, "indices")
        axis = norm_axis(node, node.attrs["axis"], len(data.shape))
        _fits(node, idx.shape, data.shape, axis, "indices")
        return [TensorInfo(data.dtype, idx.shape)]

    def forward(self, node, xs):
        data, idx = xs
        axis = node.attrs["axis"] % data.dim()
        return [torch.gather(data, axis, _wrap(idx, data.shape[axis]))]


@register
class GatherND(Op):
    name = "GatherND"
    inputs = (2, 2)
    attrs = {"batch_dims": 0}
    summary = "slices of x at the index tuples in the last axis of indices, after batch_dims shared axes"
    quant = "passthrough"

    def infer(self, node, ins):
        data, idx = ins
        require_dtype(node, idx, ("int64",), "indices")
        b = node.attrs["batch_dims"]
        r, q = len(data.shape), len(idx.shape)
        if q < 1 or r < 1 or not 0 <= b < min(q, r):
            fail(node, f"batch_dims {b} needs data and indices of rank above it (ranks {r} and {q})")
        k = idx.shape[-1]
        if not isinstance(k, int):
            unsupported(node, f"the index tuple length (last indices dim, {k}) must be static")
        if not 1 <= k <= r - b:
            fail(node, f"index tuples of length {k} do not fit data of rank {r} after {b} batch dims")
        for i, (d, n) in enumerate(zip(data.shape[:b], idx.shape[:b])):
            if isinstance(d, int) and isinstance(n, int) and d != n:
                fail(node, f"batch dim {i} differs: data {d}, indices {n}")
        return [TensorInfo(data.dtype, (*data.shape[:b], *idx.shape[b:-1], *data.shape[b + k:]))]

    def forward(self, node, xs):
        data, idx = xs
        b, k = node.attrs["batch_dims"], idx.shape[-1]
        batch, sub, rest = data.shape[:b], tuple(data.shape[b:b + k]), data.shape[b + k:]
        n = int(np.prod(batch, dtype=np.int64))
        offsets = _linear_index(idx.reshape(n, -1, k), sub)  # [batch, tuples]
        table = data.reshape(n, int(np.prod(sub, dtype=np.int64)), *rest)
        out = table[torch.arange(n).unsqueeze(1), offsets]
        return [out.reshape(*batch, *idx.shape[b:-1], *rest)]


@register
class ScatterElements(Op):
    name = "ScatterElements"
    inputs = (3, 3)
    attrs = {"axis": 0, "reduction": "none"}
    summary = "x with updates written at indices along axis; reduction none/add/mul/max/min (duplicates: undefined)"

    def from_onnx(self, ctx, node):
        _check_reduction(node)

    def infer(self, node, ins):
        data, idx, upd = ins
        require_dtype(node, idx, INDEX, "indices")
        _check_reduction(node, data.dtype)
        if upd.dtype != data.dtype:
            fail(node, f"updates dtype {upd.dtype} differs from the data's {data.dtype}")
        axis = norm_axis(node, node.attrs["axis"], len(data.shape))
        _fits(node, idx.shape, data.shape, axis, "indices")
        if tuple(upd.shape) != tuple(idx.shape):
            fail(node, f"updates shape {list(upd.shape)} differs from the indices' {list(idx.shape)}")
        return [TensorInfo(data.dtype, data.shape)]

    def forward(self, node, xs):
        data, idx, upd = xs
        axis = node.attrs["axis"] % data.dim()
        idx = _wrap(idx, data.shape[axis])
        r = node.attrs["reduction"]
        if r == "none":
            return [data.scatter(axis, idx, upd)]
        if r == "add":
            return [data.scatter_add(axis, idx, upd)]
        return [data.scatter_reduce(axis, idx, upd, _TORCH_REDUCE[r], include_self=True)]


@register
class ScatterND(Op):
    name = "ScatterND"
    inputs = (3, 3)
    attrs = {"reduction": "none"}
    summary = "x with update slices written at index tuples; reduction none/add/mul/max/min (duplicates: undefined)"

    def from_onnx(self, ctx, node):
        _check_reduction(node)

    def infer(self, node, ins):
        data, idx, upd = ins
        require_dtype(node, idx, ("int64",), "indices")
        _check_reduction(node, data.dtype)
        if upd.dtype != data.dtype:
            fail(node, f"updates dtype {upd.dtype} differs from the data's {data.dtype}")
        k = idx.shape[-1] if idx.shape else None
        if not isinstance(k, int):
            unsupported(node, "the index tuple length (last indices dim) must be static")
        if not 1 <= k <= len(data.shape):
            fail(node, f"index tuples of length {k} do not fit data of rank {len(data.shape)}")
        want = (*idx.shape[:-1], *data.shape[k:])
        if len(upd.shape) != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                              for a, b in zip(upd.shape, want)):
            fail(node, f"updates shape {list(upd.shape)} should be {list(want)}")
        return [TensorInfo(data.dtype, data.shape)]

    def forward(self, node, xs):
        data, idx, upd = xs
        k = idx.shape[-1]
        sub = tuple(data.shape[:k])
        cells, width = int(np.prod(sub, dtype=np.int64)), int(np.prod(data.shape[k:], dtype=np.int64))
        offsets = _linear_index(idx.reshape(-1, k), sub)
        out = data.reshape(cells, width).clone()  # one row per index tuple's target
        rows = upd.reshape(offsets.numel(), width)
        r = node.attrs["reduction"]
        if r == "none":
            out[offsets] = rows
        elif r == "add":
            out.index_add_(0, offsets, rows)
        else:
            out.scatter_reduce_(0, offsets.unsqueeze(1).expand_as(rows), rows, _TORCH_REDUCE[r], include_self=True)
        return [out.reshape(data.shape)]


@register
class OneHot(Op):
    name = "OneHot"
    inputs = (3, 3)
    attrs = {"axis": -1}
    summary = "values[1] where a new axis equals the index (negative: from depth), else values[0]; static depth"

    def infer(self, node, ins):
        idx, depth, values = ins
        require_dtype(node, idx, NUMERIC, "indices")
        require_dtype(node, depth, NUMERIC, "depth")
        require_dtype(node, values, ANY, "values")
        if depth.value is None or np.asarray(depth.value).size != 1 or depth.value.dtype == object:
            unsupported(node, "depth must be one number known when the graph is imported")
        n = int(np.asarray(depth.value).reshape(-1)[0])  # a float depth converts toward zero
        if n < 1:
            fail(node, f"depth {n} is not positive")
        if tuple(values.shape) != (2,):
            fail(node, f"values shape {list(values.shape)} should be [2] (off, on)")
        rank = len(idx.shape) + 1
        axis = norm_axis(node, node.attrs["axis"], rank)
        return [TensorInfo(values.dtype, (*idx.shape[:axis], n, *idx.shape[axis:]))]

    def forward(self, node, xs):
        idx, depth, values = xs
        n = int(depth.reshape(-1)[0])
        axis = node.attrs["axis"] % (idx.dim() + 1)
        # non-integer indices convert toward zero (ONNX: cast to int64); out of range ones match nothing
        hot = _wrap(idx, n).unsqueeze(-1) == torch.arange(n)
        return [torch.where(hot, values[1], values[0]).movedim(-1, axis)]
