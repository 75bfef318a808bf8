"""L2 normalization recognised as one op, so that it quantizes as one integer rule.

``F.normalize(x, dim=d)`` exports as ReduceL2(x, [d], keepdims=1) -> Clip(min=eps) ->
Expand(to x's shape) -> Div(x, .); ``x / x.norm(dim=d, keepdim=True)`` as the same
without the Clip and the Expand. Div of two activations has no quantization rule
(its quotient's precision depends on both grids), while the whole normalization
has an exact one (npuforge/quant/layernorm_rule.py). The Div becomes
``L2Normalize(x, axes, epsilon)``; the ReduceL2, Clip and Expand go when nothing
else reads them.
"""

from __future__ import annotations

from ..ir import dtypes
from .manager import register_pass
from .rewrite import const, prune, scalar


def _norm_of(graph, name: str, producers: dict) -> tuple | None:
    """(x, axes, epsilon) when ``name`` is max(||x|| over axes, epsilon), kept dims, possibly expanded."""
    node = producers.get(name)
    if node is not None and node.op == "Expand":
        node = producers.get(node.inputs[0])
    eps = 0.0
    if node is not None and node.op == "Clip":
        low = scalar(graph, node.inputs[1]) if len(node.inputs) > 1 else None
        if low is None or low < 0 or (len(node.inputs) > 2 and node.inputs[2]):
            return None
        eps, node = low, producers.get(node.inputs[0])
    if node is None or node.op != "ReduceL2" or not node.attrs.get("keepdims", 1):
        return None
    x = graph.values[node.inputs[0]]
    axes = const(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None or axes.size == 0:
        if len(node.inputs) > 1 and node.inputs[1] or node.attrs.get("noop_with_empty_axes", 0):
            return None  # axes computed at run time, or the reduction skipped
        axes = range(len(x.shape))
    return x.name, sorted(int(a) % len(x.shape) for a in axes), eps


@register_pass("recognize_normalizations", "x / max(ReduceL2(x), eps) (F.normalize) -> L2Normalize")
def recognize_normalizations(graph) -> int:
    changes = 0
    producers = graph.producers()
    for node in graph.nodes:
        if node.op != "Div" or graph.values[node.outputs[0]].dtype not in dtypes.FLOAT_DTYPES:
            continue
        found = _norm_of(graph, node.inputs[1], producers)
        if found is None or found[0] != node.inputs[0]:
            continue
        x = graph.values[node.inputs[0]]
        if x.is_const or tuple(x.shape) != tuple(graph.values[node.outputs[0]].shape):
            continue
        node.op, node.inputs, node.attrs = "L2Normalize", [found[0]], {"axes": found[1], "epsilon": found[2]}
        changes += 1
    prune(graph)
    return changes
