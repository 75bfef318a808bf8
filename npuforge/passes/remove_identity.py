"""Identity and Dropout (inference mode: y = x) are removed; their readers
read the input. When the output is a graph output, the producer's output
takes its name instead, so graph output names never change."""

from __future__ import annotations

from .manager import register_pass
from .rewrite import bypass, prune

OPS = ("Identity", "Dropout")


@register_pass("remove_identity", "Identity and Dropout (inference) are removed")
def remove_identity(graph) -> int:
    changes = 0
    for node in [n for n in graph.nodes if n.op in OPS]:
        # Dropout at import keeps only its data input and output (training_mode false)
        if len(node.outputs) == 1 and bypass(graph, node, node.inputs[0], node.outputs[0]):
            changes += 1
    prune(graph)
    return changes
