"""Pad folded into the Conv, AveragePool or MaxPool that reads it.

A Pad folds when it is in constant mode with constant pads, pads only the
spatial axes (never batch or channel) and no pad is negative (a crop), and:

* Conv: the pad value is 0 (a Conv pads with zeros);
* AveragePool: the pad value is 0 and the pool counts pads in its divisor
  (``count_include_pad=1``; a pool with no pads of its own gets that flag, as
  it then changes nothing);
* MaxPool: the pool pads with -inf, so the pad value must not change any max:
  it is -inf, or it is provably at most every input element (the input comes
  from Relu, a Clip or a fused Relu/Clip with a lower bound >= the value), the
  dilations are 1 and no window lies wholly in the padding. Otherwise the Pad
  stays.

The pads are added to the consumer's own pads; the output shape must stay the
same (with ``ceil_mode`` a window may not start in the right padding of the
attribute, while it may in a padded input), else nothing changes. Each
eligible reader is rewired on its own; the Pad goes once nothing reads it.
Typical source: TF-"same" padding (EfficientNet-Lite exported by the classic
exporter), whose pads become constants in ``fold_constants``.
"""

from __future__ import annotations

import copy

import numpy as np

from ..ops import get_op
from ..ops.activation import fused_clip_bounds
from .manager import register_pass
from .rewrite import const, infer_outputs, prune

TARGETS = ("Conv", "AveragePool", "MaxPool")
_PASS_THROUGH = ("MaxPool", "Identity", "Dropout", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze",
                 "Slice", "Gather", "Split")


def pad_spec(graph, pad) -> tuple | None:
    """(spatial pads [begins..., ends...], pad value) of a foldable Pad, else None."""
    if pad.attrs["mode"] != "constant":
        return None
    pads = const(graph, pad.inputs[1])
    if pads is None:
        return None
    value = 0.0
    if len(pad.inputs) > 2 and pad.inputs[2]:
        v = const(graph, pad.inputs[2])
        if v is None:
            return None
        value = float(v.reshape(-1)[0]) if v.size else 0.0
    axes = None
    if len(pad.inputs) > 3 and pad.inputs[3]:
        a = const(graph, pad.inputs[3])
        if a is None:
            return None
        axes = [int(i) for i in a.reshape(-1)]
    rank = len(graph.values[pad.inputs[0]].shape)
    if rank < 3:
        return None
    full = get_op("Pad").full_pads(pad, rank, [int(p) for p in pads.reshape(-1)], axes)
    if min(full) < 0 or full[0] or full[1] or full[rank] or full[rank + 1]:
        return None
    return full[2:rank] + full[rank + 2:], value


def lower_bound(graph, name: str, depth: int = 0) -> float | None:
    """A proven lower bound of every element of ``name``, or None."""
    data = const(graph, name)
    if data is not None:
        return float(data.min()) if data.size else None
    if depth > 16:
        return None
    prod = graph.producers().get(name)
    if prod is None:
        return None
    if prod.op in ("Relu", "Sigmoid", "HardSigmoid", "Softmax"):
        return 0.0
    if prod.op == "Clip":
        lo = const(graph, prod.inputs[1]) if len(prod.inputs) > 1 and prod.inputs[1] else None
        return None if lo is None else float(lo.reshape(-1)[0])
    if prod.op in ("Conv", "Gemm"):
        bounds = fused_clip_bounds(prod)
        return None if bounds is None else float(np.min(bounds[0]))
    if prod.op in _PASS_THROUGH:
        return lower_bound(graph, prod.inputs[0], depth + 1)
    return None


def _no_window_in_padding(graph, node, x_shape) -> bool:
    a = node.attrs
    nsp = len(x_shape) - 2
    out = graph.values[node.outputs[0]].shape[2:]
    for i in range(nsp):
        k, s, pb = a["kernel_shape"][i], a["strides"][i], a["pads"][i]
        if a["dilations"][i] != 1 or pb > k - 1:
            return False
        last_start = (out[i] - 1) * s - pb
        if last_start >= x_shape[2 + i]:
            return False
    return True


def _try_fold(graph, pad, node, spatial, value) -> bool:
    a = node.attrs
    x = pad.inputs[0]
    if node.op in ("Conv", "AveragePool") and value != 0.0:
        return False
    if node.op == "AveragePool" and not a["count_include_pad"] and any(a["pads"]):
        return False
    if node.op == "MaxPool" and value != float("-inf"):
        bound = lower_bound(graph, x)
        if bound is None or not value <= bound:
            return False
    saved_attrs, saved_inputs = copy.deepcopy(node.attrs), list(node.inputs)
    a["pads"] = [p + q for p, q in zip(a["pads"], spatial)]
    if node.op == "AveragePool":
        a["count_include_pad"] = 1
    node.inputs[0] = x
    ok = True
    try:
        outs = infer_outputs(graph, node)
        ok = tuple(outs[0].shape) == tuple(graph.values[node.outputs[0]].shape)
    except Exception:
        ok = False
    if ok and node.op == "MaxPool" and value != float("-inf"):
        ok = _no_window_in_padding(graph, node, graph.values[x].shape)
    if not ok:
        node.attrs, node.inputs = saved_attrs, saved_inputs
    return ok


@register_pass("fold_pad", "a constant-mode spatial Pad folded into the Conv/AveragePool/MaxPool reading it")
def fold_pad(graph) -> int:
    changes = 0
    for pad in [n for n in graph.nodes if n.op == "Pad"]:
        spec = pad_spec(graph, pad)
        if spec is None:
            continue
        spatial, value = spec
        for node in list(graph.consumers().get(pad.outputs[0], [])):
            if node.op in TARGETS and node.inputs[0] == pad.outputs[0] and _try_fold(graph, pad, node, spatial, value):
                changes += 1
    prune(graph)
    return changes
