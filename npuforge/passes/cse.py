"""Common subexpression elimination.

Constants with the same dtype, shape and bytes become one constant; then a
node with the same op, the same inputs (in order) and the same attributes as
an earlier node is removed and its readers read the earlier node's outputs.
Graph inputs and outputs keep their names (a duplicate that is a graph output
whose twin is one too stays).
"""

from __future__ import annotations

import hashlib
import json

from .manager import register_pass
from .rewrite import prune, replace_uses


def _dedupe_constants(graph) -> int:
    seen: dict = {}
    changes = 0
    for v in graph.constants():
        if v.name in graph.outputs:
            continue
        key = (v.dtype, tuple(v.shape), hashlib.sha256(v.data.tobytes()).hexdigest())
        if key in seen:
            replace_uses(graph, v.name, seen[key])
            changes += 1
        else:
            seen[key] = v.name
    return changes


def _node_key(node) -> tuple:
    return (node.op, tuple(node.inputs), len(node.outputs), json.dumps(node.attrs, sort_keys=True, default=str))


@register_pass("cse", "duplicate constants and duplicate nodes (same op, inputs and attributes) are merged")
def cse(graph) -> int:
    changes = _dedupe_constants(graph)
    seen: dict = {}
    for node in list(graph.nodes):
        key = _node_key(node)
        twin = seen.get(key)
        if twin is None:
            seen[key] = node
            continue
        if any(mine in graph.outputs for mine in node.outputs):
            continue
        graph.nodes.remove(node)
        for mine, theirs in zip(node.outputs, twin.outputs):
            replace_uses(graph, mine, theirs)
            graph.values.pop(mine, None)
        changes += 1
    prune(graph)
    return changes
