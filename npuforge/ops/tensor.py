"""Layout ops: Identity, Dropout, Flatten, Reshape, Transpose, Concat, Split,
Slice, Squeeze, Unsqueeze, Pad."""

import numpy as np
import torch
import torch.nn.functional as F

from .conv import torch_pad_arg
from .registry import (
    Op, Structural, TensorInfo, const_ints, dim_product, dim_quotient, fail, norm_axis, register,
    static_dims, unsupported,
)


def _reshape_values(values, outs):
    return [np.reshape(values[0], outs[0].shape)]


@register
class Identity(Structural):
    name = "Identity"
    summary = "y = x"
    quant = "passthrough"

    def infer(self, node, ins):
        return [TensorInfo(ins[0].dtype, ins[0].shape)]

    def np_forward(self, node, values, outs):
        return [values[0]]

    def forward(self, node, xs):
        return [xs[0]]


@register
class Dropout(Identity):
    name = "Dropout"
    inputs = (1, 3)
    outputs = (1, 2)
    attrs = {"seed": 0}
    summary = "inference mode: y = x (mask output unsupported)"
    quant = "passthrough"

    def from_onnx(self, ctx, node):
        if len(node.outputs) > 1 and node.outputs[1]:
            unsupported(node, "the mask output is not supported (inference only)")
        if len(node.inputs) > 2 and node.inputs[2]:
            mode = ctx.info(node.inputs[2]).value
            if mode is None or bool(np.asarray(mode).reshape(-1)[0]):
                unsupported(node, "training_mode must be a constant false")
        node.inputs, node.outputs = node.inputs[:1], node.outputs[:1]


@register
class Flatten(Structural):
    name = "Flatten"
    attrs = {"axis": 1}
    summary = "reshape to 2-D at axis"
    quant = "passthrough"

    def infer(self, node, ins):
        x = ins[0]
        rank = len(x.shape)
        axis = node.attrs["axis"]
        if not -rank <= axis <= rank:
            fail(node, f"axis {axis} is out of range for rank {rank}")
        axis = axis + rank if axis < 0 else axis
        return [TensorInfo(x.dtype, (dim_product(x.shape[:axis]), dim_product(x.shape[axis:])))]

    np_forward = staticmethod(lambda node, values, outs: _reshape_values(values, outs))

    def forward(self, node, xs):
        x = xs[0]
        axis = node.attrs["axis"] + x.dim() if node.attrs["axis"] < 0 else node.attrs["axis"]
        return [x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)]


@register
class Reshape(Structural):
    name = "Reshape"
    inputs = (2, 2)
    attrs = {"allowzero": 0}
    summary = "reshape to a static target (0 copies a dim, -1 infers one)"
    quant = "passthrough"

    def infer(self, node, ins):
        x = ins[0]
        target = const_ints(node, ins[1], "the target shape")
        out, infer_at = [], None
        for i, d in enumerate(target):
            if d == 0 and not node.attrs["allowzero"]:
                if i >= len(x.shape):
                    fail(node, f"target {target} copies dim {i} that the input {list(x.shape)} lacks")
                d = x.shape[i]
            elif d == -1:
                if infer_at is not None:
                    fail(node, f"target {target} has more than one -1")
                infer_at = i
            elif isinstance(d, int) and d < 0:
                fail(node, f"target {target} has a negative dim")
            out.append(d)
        total = dim_product(x.shape)
        if infer_at is not None:
            out[infer_at] = dim_quotient(node, total, dim_product(out[:infer_at] + out[infer_at + 1:]))
        elif isinstance(total, int) and isinstance(dim_product(out), int) and total != dim_product(out):
            fail(node, f"cannot reshape {list(x.shape)} ({total} elements) to {out}")
        return [TensorInfo(x.dtype, tuple(out))]

    np_forward = staticmethod(lambda node, values, outs: _reshape_values(values, outs))

    def forward(self, node, xs):
        x, shape = xs
        target = [int(d) for d in shape.tolist()]
        if not node.attrs["allowzero"]:
            target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
        return [x.reshape(target)]


@register
class Transpose(Structural):
    name = "Transpose"
    attrs = {"perm": []}
    summary = "permute axes (reverse when perm is absent)"
    quant = "passthrough"

    def perm(self, node, rank):
        perm = list(node.attrs["perm"]) or list(reversed(range(rank)))
        if sorted(perm) != list(range(rank)):
            fail(node, f"perm {perm} is not a permutation of {rank} axes")
        return perm

    def infer(self, node, ins):
        x = ins[0]
        perm = self.perm(node, len(x.shape))
        return [TensorInfo(x.dtype, tuple(x.shape[p] for p in perm))]

    def np_forward(self, node, values, outs):
        return [np.transpose(values[0], self.perm(node, values[0].ndim))]

    def forward(self, node, xs):
        return [xs[0].permute(self.perm(node, xs[0].dim()))]


@register
class Concat(Structural):
    name = "Concat"
    inputs = (1, 1 << 16)
    attrs = {"axis": 0}
    summary = "join along axis; other dims must agree"
    quant = "concat"

    def infer(self, node, ins):
        first = ins[0]
        rank = len(first.shape)
        axis = norm_axis(node, node.attrs["axis"], rank)
        for i in ins[1:]:
            if i.dtype != first.dtype or len(i.shape) != rank:
                fail(node, f"inputs disagree: {first.dtype}{list(first.shape)} vs {i.dtype}{list(i.shape)}")
            for k in range(rank):
                a, b = first.shape[k], i.shape[k]
                if k != axis and a != b and isinstance(a, int) and isinstance(b, int):
                    fail(node, f"inputs disagree on axis {k}: {list(first.shape)} vs {list(i.shape)}")
        shape = list(first.shape)
        shape[axis] = _sum_dims([i.shape[axis] for i in ins])
        return [TensorInfo(first.dtype, tuple(shape))]

    def np_forward(self, node, values, outs):
        return [np.concatenate(values, axis=node.attrs["axis"])]

    def forward(self, node, xs):
        return [torch.cat(xs, dim=node.attrs["axis"])]


def _sum_dims(dims):
    if all(isinstance(d, int) for d in dims):
        return sum(dims)
    return "+".join(str(d) for d in dims)


@register
class Split(Op):
    name = "Split"
    inputs = (1, 2)
    outputs = (1, 1 << 16)
    attrs = {"axis": 0, "num_outputs": 0}
    summary = "split along axis by sizes, or into equal parts (last one smaller)"
    quant = "passthrough"

    def sizes(self, node, ins) -> list:
        x = ins[0]
        axis = norm_axis(node, node.attrs["axis"], len(x.shape))
        dim = static_dims(node, (x.shape[axis],))[0]
        split = const_ints(node, ins[1], "split") if len(ins) > 1 else None
        n = len(node.outputs)
        if split is not None:
            if len(split) != n or sum(split) != dim or min(split) < 0:
                fail(node, f"split {split} does not divide dim {dim} into {n} outputs")
            return split
        if node.attrs["num_outputs"] and node.attrs["num_outputs"] != n:
            fail(node, f"num_outputs {node.attrs['num_outputs']} but the node has {n} outputs")
        chunk = -(-dim // n)
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        if sizes[-1] < 0:
            fail(node, f"dim {dim} cannot be split into {n} outputs")
        return sizes

    def infer(self, node, ins):
        x = ins[0]
        axis = norm_axis(node, node.attrs["axis"], len(x.shape))
        outs = []
        for s in self.sizes(node, ins):
            shape = list(x.shape)
            shape[axis] = s
            outs.append(TensorInfo(x.dtype, tuple(shape)))
        return outs

    def onnx_nodes(self, node):
        from onnx import helper

        extra = {} if len(node.inputs) > 1 and node.inputs[1] else {"num_outputs": len(node.outputs)}
        return [helper.make_node("Split", node.inputs, node.outputs, name=node.name, axis=node.attrs["axis"], **extra)]

    def forward(self, node, xs):
        x = xs[0]
        n = len(node.outputs)
        if len(xs) > 1 and xs[1] is not None:
            sizes = [int(s) for s in xs[1].tolist()]
        else:
            dim = x.shape[node.attrs["axis"]]
            chunk = -(-dim // n)
            sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        return list(torch.split(x, sizes, dim=node.attrs["axis"]))


def slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice clamping for one axis -> (start, end, count)."""
    if step == 0:
        raise ValueError("step 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        count = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        count = max(0, -(-(start - end) // -step))
    return start, end, count


@register
class Slice(Structural):
    name = "Slice"
    inputs = (3, 5)
    summary = "strided slice with ONNX clamping; negative steps"
    quant = "passthrough"

    def params(self, node, shape, starts, ends, axes, steps):
        rank = len(shape)
        axes = list(axes) if axes is not None else list(range(len(starts)))
        steps = list(steps) if steps is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            fail(node, "starts, ends, axes and steps must have the same length")
        axes = [norm_axis(node, a, rank) for a in axes]
        if len(set(axes)) != len(axes):
            fail(node, f"axes {axes} repeat")
        if 0 in steps:
            fail(node, "a step is 0")
        return list(zip(axes, starts, ends, steps))

    def infer(self, node, ins):
        x = ins[0]
        vals = [const_ints(node, i, what) if i is not None else None
                for i, what in zip(ins[1:], ("starts", "ends", "axes", "steps"))]
        vals += [None] * (4 - len(vals))
        shape = list(x.shape)
        for axis, start, end, step in self.params(node, x.shape, *vals):
            dim = shape[axis]
            if isinstance(dim, str):
                if start == 0 and step == 1 and isinstance(end, int) and end >= (1 << 31):
                    continue  # the whole dynamic axis
                unsupported(node, f"slicing dynamic axis {axis} ({dim}) needs a static size")
            shape[axis] = slice_range(dim, start, end, step)[2]
        return [TensorInfo(x.dtype, tuple(shape))]

    def indices(self, node, shape, values):
        """(axis, source indices) for each sliced axis."""
        lists = [None if v is None else [int(a) for a in v] for v in values]
        lists += [None] * (4 - len(lists))
        for axis, start, end, step in self.params(node, shape, *lists):
            s, _, count = slice_range(shape[axis], start, end, step)
            yield axis, list(range(s, s + step * count, step))

    def np_forward(self, node, values, outs):
        x = values[0]
        for axis, idx in self.indices(node, x.shape, [None if v is None else v.reshape(-1) for v in values[1:]]):
            x = np.take(x, idx, axis=axis)
        return [x]

    def forward(self, node, xs):
        x = xs[0]
        for axis, idx in self.indices(node, tuple(x.shape), [None if v is None else v.tolist() for v in xs[1:]]):
            x = x.index_select(axis, torch.tensor(idx, dtype=torch.int64))
        return [x]


@register
class Squeeze(Structural):
    name = "Squeeze"
    inputs = (1, 2)
    summary = "drop size-1 axes (all of them when axes is absent)"
    quant = "passthrough"

    def axes(self, node, ins):
        x = ins[0]
        axes = const_ints(node, ins[1], "axes") if len(ins) > 1 else None
        if axes is None:
            return [i for i, d in enumerate(x.shape) if d == 1]
        axes = [norm_axis(node, a, len(x.shape)) for a in axes]
        for a in axes:
            if x.shape[a] != 1 and isinstance(x.shape[a], int):
                fail(node, f"axis {a} of {list(x.shape)} is not 1")
        return axes

    def infer(self, node, ins):
        x = ins[0]
        axes = self.axes(node, ins)
        return [TensorInfo(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]

    np_forward = staticmethod(lambda node, values, outs: _reshape_values(values, outs))

    def forward(self, node, xs):
        x = xs[0]
        if len(xs) > 1 and xs[1] is not None:
            axes = [int(a) % x.dim() for a in xs[1].tolist()]
        else:
            axes = [i for i, d in enumerate(x.shape) if d == 1]
        return [x.reshape([d for i, d in enumerate(x.shape) if i not in axes])]


@register
class Unsqueeze(Structural):
    name = "Unsqueeze"
    inputs = (2, 2)
    summary = "insert size-1 axes at positions of the output"
    quant = "passthrough"

    def out_shape(self, node, shape, axes):
        rank = len(shape) + len(axes)
        axes = sorted(norm_axis(node, a, rank) for a in axes)
        if len(set(axes)) != len(axes):
            fail(node, f"axes {axes} repeat")
        rest = iter(shape)
        return tuple(1 if i in axes else next(rest) for i in range(rank))

    def infer(self, node, ins):
        x = ins[0]
        return [TensorInfo(x.dtype, self.out_shape(node, x.shape, const_ints(node, ins[1], "axes")))]

    np_forward = staticmethod(lambda node, values, outs: _reshape_values(values, outs))

    def forward(self, node, xs):
        x = xs[0]
        return [x.reshape(self.out_shape(node, tuple(x.shape), [int(a) for a in xs[1].tolist()]))]


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_index(n: int, before: int, after: int, mode: str) -> torch.Tensor:
    """Source index of every output position along one axis for reflect/edge/wrap."""
    pos = torch.arange(-before, n + after)
    if mode == "edge":
        return pos.clamp(0, n - 1)
    if mode == "wrap":
        return pos % n
    period = 2 * (n - 1)  # reflect, without repeating the edge
    if period == 0:
        return torch.zeros_like(pos)
    pos = pos % period
    return torch.where(pos < n, pos, period - pos)


@register
class Pad(Op):
    name = "Pad"
    inputs = (2, 4)
    attrs = {"mode": "constant"}
    summary = "pad (or crop, with negative pads) in constant, reflect, edge or wrap mode; optional axes"
    quant = "passthrough"

    def from_onnx(self, ctx, node):
        if node.attrs["mode"] not in _PAD_MODES:
            unsupported(node, f"mode '{node.attrs['mode']}' is not one of {', '.join(_PAD_MODES)}")

    def full_pads(self, node, rank, pads, axes):
        if axes is None:
            axes = list(range(rank))
        axes = [norm_axis(node, a, rank) for a in axes]
        if len(pads) != 2 * len(axes):
            fail(node, f"pads has {len(pads)} entries, expected {2 * len(axes)}")
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        return full

    def infer(self, node, ins):
        x = ins[0]
        rank = len(x.shape)
        pads = const_ints(node, ins[1], "pads")
        axes = const_ints(node, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
        full = self.full_pads(node, rank, pads, axes)
        shape = []
        for i, d in enumerate(x.shape):
            if full[i] == 0 and full[i + rank] == 0:
                shape.append(d)
                continue
            n = static_dims(node, (d,))[0]
            d = n + full[i] + full[i + rank]
            if d < 0:
                fail(node, f"pads {pads} crop axis {i} below zero")
            kept = n + min(full[i], 0) + min(full[i + rank], 0)
            if node.attrs["mode"] == "reflect" and max(full[i], full[i + rank]) > kept - 1:
                # ONNX Runtime refuses a mirror wider than the axis it reflects
                fail(node, f"reflect pads {pads} exceed axis {i} of length {kept}; pad at most {kept - 1}")
            if node.attrs["mode"] != "constant" and kept == 0:
                fail(node, f"{node.attrs['mode']} pads {pads} have nothing to repeat on axis {i}")
            shape.append(d)
        if len(ins) > 2 and ins[2] is not None and ins[2].dtype != x.dtype:
            fail(node, f"constant_value dtype {ins[2].dtype} differs from the input's {x.dtype}")
        return [TensorInfo(x.dtype, tuple(shape))]

    def forward(self, node, xs):
        x = xs[0]
        rank = x.dim()
        axes = [int(a) for a in xs[3].tolist()] if len(xs) > 3 and xs[3] is not None else None
        full = self.full_pads(node, rank, [int(p) for p in xs[1].tolist()], axes)
        mode = node.attrs["mode"]
        if mode == "constant":
            value = xs[2].reshape(-1)[0].item() if len(xs) > 2 and xs[2] is not None and xs[2].numel() else 0
            return [F.pad(x, torch_pad_arg(full), value=value)]
        for axis in range(rank):
            before, after = full[axis], full[axis + rank]
            # negative pads crop first; the padding then reads the cropped tensor (as ONNX Runtime does)
            x = x.narrow(axis, -min(before, 0), x.shape[axis] + min(before, 0) + min(after, 0))
            if before > 0 or after > 0:
                x = x.index_select(axis, _pad_index(x.shape[axis], max(before, 0), max(after, 0), mode))
        return [x]
