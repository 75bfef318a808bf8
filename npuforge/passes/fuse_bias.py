"""A bias-like Add (or Sub) after a Conv or Gemm merged into its bias.

``Add(conv_out, K)`` adds K per output channel only when K, broadcast the way
ONNX broadcasts (shapes aligned on the RIGHT), varies at most along the
channel axis: for a Conv output [N, C, H, W] that is K of shape [C, 1, 1] or
[1, C, 1, 1] (or any all-ones shape: one value for every channel); for a Gemm
output [M, N] it is [N] or [1, N] (or all-ones). A K of shape [C] against
[N, C, H, W] broadcasts along the LAST axis (W), so it is not a per-channel
bias and is left alone, even when C == W. :func:`per_channel` makes the
broadcast explicit and the pass checks the result against ``np.broadcast_to``.

Conditions: the Conv/Gemm output is read only by this Add/Sub and is not a
graph output, the Conv/Gemm carries no fused activation, its bias (if any)
is a constant, and the Add's output shape equals the Conv/Gemm output shape.
``Sub(conv_out, K)`` merges as a bias of -K. The new bias is a new constant.
"""

from __future__ import annotations

import numpy as np

from .manager import register_pass
from .rewrite import absorb_consumer, const, new_const, prune, single_consumer

TARGETS = ("Conv", "Gemm")


def per_channel(k_shape: tuple, out_shape: tuple, k: np.ndarray, channels: int) -> np.ndarray | None:
    """K as a [channels] vector when K broadcast against ``out_shape`` varies only on axis 1, else None."""
    rank = len(out_shape)
    if len(k_shape) > rank:
        return None
    aligned = (1,) * (rank - len(k_shape)) + tuple(k_shape)  # ONNX/numpy: align on the right
    for axis, d in enumerate(aligned):
        if d == 1:
            continue
        if axis != 1 or d != channels:
            return None
    vec = np.broadcast_to(k.reshape(aligned), (1, channels) + (1,) * (rank - 2)).reshape(channels)
    # verify: adding vec on axis 1 is what adding K with ONNX broadcasting does
    probe = np.zeros((1, channels) + (1,) * (rank - 2), np.float64)
    if not np.array_equal(probe + k.reshape(aligned).astype(np.float64),
                          probe + vec.reshape((1, channels) + (1,) * (rank - 2)).astype(np.float64)):
        return None
    return vec


def _channels(graph, node) -> int | None:
    w = const(graph, node.inputs[1])
    if w is None:
        return None
    if node.op == "Conv":
        return int(w.shape[0])
    return int(w.shape[0] if node.attrs["transB"] else w.shape[1])


@register_pass("fuse_bias", "a per-channel constant Add/Sub after a Conv/Gemm merged into its bias")
def fuse_bias(graph) -> int:
    changes = 0
    for node in [n for n in graph.nodes if n.op in TARGETS]:
        if node not in graph.nodes or node.attrs["activation"]:
            continue
        y = node.outputs[0]
        user = single_consumer(graph, y)
        if user is None or user.op not in ("Add", "Sub"):
            continue
        other = user.inputs[1] if user.inputs[0] == y else user.inputs[0]
        if user.op == "Sub" and user.inputs[0] != y:
            continue  # K - y is not a bias
        k = const(graph, other)
        channels = _channels(graph, node)
        if k is None or channels is None or graph.values[other].dtype != graph.values[y].dtype:
            continue
        y_shape = tuple(graph.values[y].shape)
        if tuple(graph.values[user.outputs[0]].shape) != y_shape:
            continue
        vec = per_channel(tuple(k.shape), y_shape, k, channels)
        if vec is None:
            continue
        b_name = node.inputs[2] if len(node.inputs) > 2 else ""
        b = const(graph, b_name)
        if b_name and b is None:
            continue
        vec = vec.astype(np.float64) * (-1.0 if user.op == "Sub" else 1.0)
        if node.op == "Conv":
            new_b = (b.astype(np.float64) if b is not None else 0.0) + vec
        else:  # Gemm: bias term is beta * C
            c = b.astype(np.float64) * node.attrs["beta"] if b is not None else np.zeros(())
            new_b = c + vec  # C ([N], [1, N], [M, N], scalar) broadcast with the [N] vector
            node.attrs["beta"] = 1.0
        dtype = const(graph, node.inputs[1]).dtype
        bias_base = b_name or f"{node.name}/bias"
        node.inputs = list(node.inputs[:2]) + [new_const(graph, f"{bias_base}/fused", np.asarray(new_b).astype(dtype))]
        absorb_consumer(graph, node, user)
        changes += 1
    prune(graph)
    return changes
