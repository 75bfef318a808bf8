"""Activation fusion: a Conv or Gemm followed by Relu, Clip (constant bounds,
e.g. ReLU6 = Clip(0, 6)) or LeakyRelu carries the activation in its
``activation`` / ``activation_params`` attributes, so quantization sees one op
with one output range.

Only when the Conv/Gemm output is read by that activation alone and is not a
graph output, and the Conv/Gemm has no fused activation yet. A Clip with one
bound missing fuses only as Relu (min 0, no max); otherwise both bounds must be
constant scalars. The activation's output name is kept.
"""

from __future__ import annotations

from .manager import register_pass
from .rewrite import absorb_consumer, prune, scalar, single_consumer

TARGETS = ("Conv", "Gemm")


def fused_form(graph, act) -> tuple | None:
    """(activation, params) for the ``activation`` attributes, or None."""
    if act.op == "Relu":
        return "Relu", []
    if act.op == "LeakyRelu":
        return "LeakyRelu", [float(act.attrs["alpha"])]
    if act.op == "Clip":
        lo_name = act.inputs[1] if len(act.inputs) > 1 else ""
        hi_name = act.inputs[2] if len(act.inputs) > 2 else ""
        lo = scalar(graph, lo_name) if lo_name else None
        hi = scalar(graph, hi_name) if hi_name else None
        if (lo_name and lo is None) or (hi_name and hi is None):
            return None  # a bound computed at run time
        if lo is not None and hi is not None:
            return "Clip", [lo, hi]
        if lo == 0.0 and not hi_name:
            return "Relu", []
    return None


@register_pass("fuse_activation", "Relu, Clip or LeakyRelu after a Conv/Gemm carried as its fused activation")
def fuse_activation(graph) -> int:
    changes = 0
    for node in [n for n in graph.nodes if n.op in TARGETS]:
        if node.attrs["activation"]:
            continue
        y = node.outputs[0]
        act = single_consumer(graph, y)
        if act is None or act.inputs[0] != y:
            continue
        form = fused_form(graph, act)
        if form is None:
            continue
        node.attrs["activation"], node.attrs["activation_params"] = form[0], list(form[1])
        absorb_consumer(graph, node, act)
        changes += 1
    prune(graph)
    return changes
