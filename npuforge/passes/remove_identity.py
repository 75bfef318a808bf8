"""Identity, Dropout (inference mode: y = x) and a Cast to its input's own type are removed; their
readers read the input. When the output is a graph output, the producer's output
takes its name instead, so graph output names never change."""

from __future__ import annotations

from .manager import register_pass
from .rewrite import bypass, prune

OPS = ("Identity", "Dropout")


@register_pass("remove_identity", "Identity, Dropout (inference) and a Cast to the type it has are removed")
def remove_identity(graph) -> int:
    changes = 0
    for node in [n for n in graph.nodes if n.op in OPS or _same_type_cast(graph, n)]:
        # Dropout at import keeps only its data input and output (training_mode false)
        if len(node.outputs) == 1 and bypass(graph, node, node.inputs[0], node.outputs[0]):
            changes += 1
    prune(graph)
    return changes


def _same_type_cast(graph, node) -> bool:
    """A Cast to the type its input already has (exporters write float32 -> float32 ones)."""
    return node.op == "Cast" and graph.values[node.inputs[0]].dtype == node.attrs.get("to")
