"""BatchNormalization folding.

Inference-mode BN is y = x * s + t per channel (axis 1), with
s = scale / sqrt(var + epsilon) and t = B - mean * s.

* Into a preceding Conv, ConvTranspose or Gemm whose output only this BN reads
  (and that is not a graph output, and carries no fused activation): the
  weights of each output channel are multiplied by s, the bias becomes
  bias * s + t. For Gemm (output [M, N], channels on N) the columns of B' are
  scaled and C becomes beta * C * s + t with beta set to 1.
* A BN with nothing to fold into becomes a per-channel scale and shift:
  ``Mul(x, s) -> Add(., t)`` with constants shaped ``[C, 1, ..., 1]`` (rank of
  x minus one, so they broadcast on axis 1 exactly). Two elementwise ops that
  quantization already handles were preferred to a depthwise 1x1 Conv, which
  would need a weight layout and a group count only to express a scale.

The new weights are computed in float64 and stored in the weights' dtype under
new names (a weight shared with another node is never changed).
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes
from ..ir.graph import Node, Value
from .manager import register_pass
from .rewrite import const, new_const, new_value_name, prune, single_consumer, unique_node_name

TARGETS = ("Conv", "ConvTranspose", "Gemm")


def bn_scale_shift(graph, bn) -> tuple | None:
    params = [const(graph, name) for name in bn.inputs[1:5]]
    if any(p is None for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
    s = scale / np.sqrt(var + bn.attrs["epsilon"])
    return s, bias - mean * s


def _fold_into(graph, prod, bn, s, t) -> bool:
    w = const(graph, prod.inputs[1])
    if w is None or prod.attrs.get("activation", "") != "":
        return False
    b_name = prod.inputs[2] if len(prod.inputs) > 2 else ""
    b = const(graph, b_name)
    if b_name and b is None:
        return False
    dtype = w.dtype
    w64 = w.astype(np.float64)
    if prod.op == "Conv":
        if w.shape[0] != s.size:
            return False
        new_w = w64 * s.reshape(-1, *([1] * (w.ndim - 1)))
        new_b = (b.astype(np.float64) * s if b is not None else 0.0) + t
    elif prod.op == "ConvTranspose":
        g = prod.attrs["group"]
        cin, cout_g = w.shape[0], w.shape[1]
        if cout_g * g != s.size:
            return False
        k = w.shape[2:]
        new_w = (w64.reshape(g, cin // g, cout_g, *k) * s.reshape(g, 1, cout_g, *([1] * len(k)))).reshape(w.shape)
        new_b = (b.astype(np.float64) * s if b is not None else 0.0) + t
    else:  # Gemm: Y = alpha * A' @ B' + beta * C, channels are the columns of B'
        if prod.attrs["transB"]:
            if w.shape[0] != s.size:
                return False
            new_w = w64 * s[:, None]
        else:
            if w.shape[1] != s.size:
                return False
            new_w = w64 * s[None, :]
        c = b.astype(np.float64) * prod.attrs["beta"] if b is not None else np.zeros(())
        new_b = c * s + t  # broadcasts C (scalar, [N], [1, N], [M, 1], [M, N]) against [N]
        prod.attrs["beta"] = 1.0
    inputs = list(prod.inputs[:2]) + [""]
    inputs[1] = new_const(graph, f"{prod.inputs[1]}/bn_folded", new_w.astype(dtype))
    bias_base = b_name or f"{prod.name}/bias"
    inputs[2] = new_const(graph, f"{bias_base}/bn_folded", np.asarray(new_b, np.float64).astype(dtype))
    prod.inputs = inputs
    old_out = prod.outputs[0]
    prod.outputs = [bn.outputs[0]]
    graph.nodes.remove(bn)
    graph.values.pop(old_out, None)
    return True


def _scale_shift(graph, bn, s, t) -> None:
    x = bn.inputs[0]
    xv = graph.values[x]
    view = (s.size,) + (1,) * (len(xv.shape) - 2)
    dtype = dtypes.to_numpy(xv.dtype)
    s_name = new_const(graph, f"{bn.name}/scale", s.reshape(view).astype(dtype))
    t_name = new_const(graph, f"{bn.name}/shift", t.reshape(view).astype(dtype))
    mid = new_value_name(graph, f"{bn.outputs[0]}/scaled")
    graph.add_value(Value(mid, xv.dtype, tuple(xv.shape)))
    mul = Node(unique_node_name(graph, f"{bn.name}/scale"), "Mul", [x, s_name], [mid], {})
    add = Node(unique_node_name(graph, f"{bn.name}/shift"), "Add", [mid, t_name], [bn.outputs[0]], {})
    at = graph.nodes.index(bn)
    graph.nodes[at:at + 1] = [mul, add]


@register_pass("fold_batchnorm",
               "BatchNormalization folded into the Conv/ConvTranspose/Gemm before it, else a per-channel Mul+Add")
def fold_batchnorm(graph) -> int:
    changes = 0
    for bn in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        params = bn_scale_shift(graph, bn)
        if params is None:
            continue
        s, t = params
        producers = graph.producers()
        prod = producers.get(bn.inputs[0])
        if (prod is not None and prod.op in TARGETS and prod.outputs[0] == bn.inputs[0]
                and single_consumer(graph, bn.inputs[0]) is bn and _fold_into(graph, prod, bn, s, t)):
            changes += 1
            continue
        _scale_shift(graph, bn, s, t)
        changes += 1
    prune(graph)
    return changes
