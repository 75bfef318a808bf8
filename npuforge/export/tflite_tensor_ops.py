"""TFLite mappings of the ops sequence and transformer models bring: a MatMul of two activations
(BATCH_MATMUL), SOFTMAX, MEAN, REDUCE_MAX and REDUCE_MIN on any axes, GATHER of a table by token
ids, TILE and BROADCAST_TO.

Each handler takes the exporter (tflite_export._Exporter) and the node. TFLite keeps 4-D tensors
in NHWC; these ops are written on the IR's (NCHW) element order where their axes would otherwise
move (``in_ir_order`` / ``write_in_ir_order``), or with their axes moved to the file's layout.
Every one only moves codes or runs the integer program the quantizer stored (checked against
LiteRT's reference kernels in tests/test_tflite_export_ops.py).
"""

from __future__ import annotations

import numpy as np

from ..quant.requant import tflite_product_multiplier
from .tflite_layout import NCHW_TO_NHWC, file_axis, refuse, same_order


def write_in_ir_order(ex, y: str, make) -> None:
    """``make(tensor)`` writes the op whose output holds ``y``'s elements in the IR's order and shape;
    a 4-D result is moved into the file's NHWC tensor of ``y`` (RESHAPE, or TRANSPOSE where orders differ)."""
    shape = ex.dims(y)
    if len(shape) != 4:
        make(ex.activation(y))
        return
    mid = ex.new_tensor(f"{y}::nchw", shape, ex.qp(y))
    make(mid)
    if same_order(shape):
        ex.op("RESHAPE", [mid, ex.int32s(f"{y}::shape", ex.shape(y))], [ex.activation(y)], "ReshapeOptions",
              NewShape=list(ex.shape(y)))
    else:
        ex.op("TRANSPOSE", [mid, ex.int32s(f"{y}::perm", NCHW_TO_NHWC)], [ex.activation(y)], "TransposeOptions")


def batch_matmul(ex, node) -> None:
    """MatMul of two activations: BATCH_MATMUL on the IR's order (sum of ``a' * b'``, one
    requantization by ``s_a * s_b / s_y`` (the product in float32, as LiteRT's) rounded twice, as the
    simulator's matmul kind)."""
    a, b = node.inputs[:2]
    qa, qb, qy = ex.qp(a), ex.qp(b), ex.qp(node.outputs[0])
    if "multiplier" not in node.quant:
        refuse(node, "it has no integer multiplier (it was kept in float)")
    ex.check_multiplier(node, "", tflite_product_multiplier(qa.scale, qb.scale, qy.scale))
    if min(len(ex.dims(a)), len(ex.dims(b))) < 2:
        refuse(node, "BATCH_MATMUL multiplies matrices (rank 2 or more)")
    lhs, rhs = ex.ir_shaped(a), ex.ir_shaped(b)
    write_in_ir_order(ex, node.outputs[0], lambda out: ex.op(
        "BATCH_MATMUL", [lhs, rhs], [out], "BatchMatMulOptions", version=2, AdjX=False, AdjY=False,
        AsymmetricQuantizeInputs=False))


def softmax(ex, node) -> None:
    """SOFTMAX runs along the file's last axis; a softmax over another axis is moved there and
    back by TRANSPOSEs (each row's codes are moved, not changed)."""
    x, y = node.inputs[0], node.outputs[0]
    rank = len(ex.dims(x))
    last, fa = rank - 1, file_axis(node.attrs["axis"], rank)
    if fa == last:
        ex.op("SOFTMAX", [ex.activation(x)], [ex.activation(y)], "SoftmaxOptions", version=2, Beta=1.0)
        return
    perm = list(range(rank))
    perm[fa], perm[last] = last, fa  # a swap: its own inverse
    shape = [ex.shape(x)[p] for p in perm]
    rows_in = ex.new_tensor(f"{node.name}::rows_in", shape, ex.qp(x))
    rows_out = ex.new_tensor(f"{node.name}::rows_out", shape, ex.qp(y))
    ex.op("TRANSPOSE", [ex.activation(x), ex.int32s(f"{node.name}::perm_in", perm)], [rows_in], "TransposeOptions")
    ex.op("SOFTMAX", [rows_in], [rows_out], "SoftmaxOptions", version=2, Beta=1.0)
    ex.op("TRANSPOSE", [rows_out, ex.int32s(f"{node.name}::perm_out", perm)], [ex.activation(y)],
          "TransposeOptions")


def reduce(ex, node, op: str, axes: list, keep: bool) -> None:
    """MEAN, REDUCE_MAX or REDUCE_MIN over any IR axes, moved to the file's axes; a 4-D input reduced
    without keeping its dims is reduced with them kept, then reshaped in the IR's order.
    (TFLite's reference MEAN sums ``x - zp_x`` over the axes and requantizes once with 1/count folded
    into the multiplier, whatever the axes: the quantizer's TFLite MEAN; the maximum and minimum
    select codes, their output shares the input's grid.)"""
    x, y = node.inputs[0], node.outputs[0]
    rank = len(ex.dims(x))
    file_axes = sorted(file_axis(a, rank) for a in axes)
    axes_t = ex.int32s(f"{node.name}::axes", file_axes)
    if rank != 4 or keep:
        ex.op(op, [ex.activation(x), axes_t], [ex.activation(y)], "ReducerOptions", version=2, KeepDims=keep)
        return
    kept = [1 if k in file_axes else d for k, d in enumerate(ex.shape(x))]  # NHWC
    out = ex.new_tensor(f"{y}::kept", kept, ex.qp(y))
    ex.op(op, [ex.activation(x), axes_t], [out], "ReducerOptions", version=2, KeepDims=True)
    n, h, w, c = kept
    if c > 1 and h * w > 1:  # the remaining channels and positions come in another order in the IR
        nchw = ex.new_tensor(f"{y}::kept_nchw", (n, c, h, w), ex.qp(y))
        ex.op("TRANSPOSE", [out, ex.int32s(f"{y}::perm", (0, 3, 1, 2))], [nchw], "TransposeOptions")
        out = nchw
    ex.op("RESHAPE", [out, ex.int32s(f"{y}::shape", ex.shape(y))], [ex.activation(y)], "ReshapeOptions",
          NewShape=list(ex.shape(y)))


def reduce_select(ex, node) -> None:
    """ReduceMax / ReduceMin: REDUCE_MAX / REDUCE_MIN (they select codes on one grid)."""
    x = node.inputs[0]
    rank = len(ex.dims(x))
    given = node.inputs[1] if len(node.inputs) > 1 else ""
    if given and not ex.g.values[given].is_const:
        refuse(node, "its axes are computed at run time")
    axes = sorted(int(a) % rank for a in np.asarray(ex.g.values[given].data).reshape(-1)) if given else []
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            refuse(node, "it reduces no axis (noop_with_empty_axes)")
        axes = list(range(rank))
    if not ex.qp(x).same_as(ex.qp(node.outputs[0])):
        refuse(node, "its output does not share its input's parameters")
    reduce(ex, node, "REDUCE_MAX" if node.op == "ReduceMax" else "REDUCE_MIN", axes,
           bool(node.attrs.get("keepdims", 1)))


def tile(ex, node) -> None:
    """Tile: TILE with the repeats moved to the file's axes (a copy of codes on one grid)."""
    x, y = node.inputs[0], node.outputs[0]
    if not ex.qp(x).same_as(ex.qp(y)):
        refuse(node, "its output does not share its input's parameters")
    repeats = np.asarray(ex.g.values[node.inputs[1]].data).reshape(-1)
    if len(repeats) == 4:
        repeats = repeats[list(NCHW_TO_NHWC)]
    ex.op("TILE", [ex.activation(x), ex.int32s(f"{node.name}::multiples", repeats)], [ex.activation(y)],
          "TileOptions", version=2)


def expand(ex, node) -> None:
    """Expand: BROADCAST_TO (a copy of codes on one grid). Both align shapes on the right: between
    tensors of one rank in the file's layout; a rank change in the IR's order (a 4-D tensor moved from
    or to it)."""
    x, y = node.inputs[0], node.outputs[0]
    if not ex.qp(x).same_as(ex.qp(y)):
        refuse(node, "its output does not share its input's parameters")
    if len(ex.dims(x)) == len(ex.dims(y)):
        ex.op("BROADCAST_TO", [ex.activation(x), ex.int32s(f"{node.name}::shape", ex.shape(y))],
              [ex.activation(y)], version=2)
        return
    src = ex.ir_shaped(x)
    write_in_ir_order(ex, y, lambda out: ex.op("BROADCAST_TO", [src, ex.int32s(f"{node.name}::shape", ex.dims(y))],
                                               [out], version=2))


def gather(ex, node) -> None:
    """Gather: GATHER of int8 codes by int32 indices. A constant table (an embedding's rows, its
    codes as the quantizer stored them on the output's grid) read by token ids (an integer graph
    input, written as int32), or an activation read at constant indices (a class token)."""
    data, idx = node.inputs[:2]
    y = node.outputs[0]
    rank, out_rank = len(ex.dims(data)), len(ex.dims(y))
    if (rank == 4) != (out_rank == 4):
        refuse(node, "a Gather between a 4-D and a non-4-D tensor moves NHWC axes; no mapping for it yet")
    dv, iv = ex.g.values[data], ex.g.values[idx]
    if dv.is_const:
        codes = dv.quant.quantize(dv.data).astype(np.int64)
        if dv.quant.dtype == "uint8":
            codes = codes - 128  # the file's int8 codes of the same reals
        if rank == 4:
            codes = codes.transpose(NCHW_TO_NHWC)
        table = ex.const(f"{node.name}::table", codes, "int8", ex.quant(ex.qp(data)))
    else:
        table = ex.activation(data)
    if iv.is_const:
        ids = np.asarray(iv.data).astype(np.int64)
        ids = np.where(ids < 0, ids + ex.dims(data)[node.attrs["axis"] % rank], ids)  # GATHER takes no negatives
        index = ex.const(f"{node.name}::indices", ids.astype(np.int32), "int32")
    else:
        index = ex.activation(idx)
    ex.op("GATHER", [table, index], [ex.activation(y)], "GatherOptions", version=2,
          Axis=file_axis(node.attrs["axis"], rank), BatchDims=0)
