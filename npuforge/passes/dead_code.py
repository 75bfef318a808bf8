"""Dead code: nodes none of whose outputs reaches a graph output, constants
nothing reads, and value entries nothing refers to, are removed. (Every other
pass also ends with this clean-up, so its count of removed nodes is its own.)"""

from __future__ import annotations

from .manager import register_pass
from .rewrite import prune


@register_pass("dead_code", "nodes whose outputs are never used and unused constants are removed")
def dead_code(graph) -> int:
    consts = len(graph.constants())
    removed = prune(graph)
    return removed + consts - len(graph.constants())
