"""Layout simplification, repeated until nothing changes:

* a Reshape, Flatten, Squeeze or Unsqueeze whose output shape equals its
  input shape (symbolic dims compared by name) is removed;
* a Transpose with the identity permutation is removed;
* Transpose(Transpose(x, p1), p2) becomes Transpose(x, p1[p2]) (removed when
  that is the identity); the first Transpose stays while others read it;
* Reshape(R(x)) where R is a Reshape, Flatten, Squeeze or Unsqueeze reads x
  directly: only the last target matters. Its target is rewritten when it has
  ``0`` entries (which copied the intermediate's dims): static dims are written
  out, a symbolic dim becomes ``0`` when x has it at the same position, or
  ``-1`` when it is the only unknown; otherwise the chain is left alone.
"""

from __future__ import annotations

import numpy as np

from .manager import register_pass
from .rewrite import bypass, const, new_const, prune

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _perm(node, rank) -> list:
    return list(node.attrs["perm"]) or list(reversed(range(rank)))


def _chain_target(graph, node, x: str) -> np.ndarray | None:
    """A constant target for ``node`` (a Reshape) reading ``x`` instead of its input."""
    target = const(graph, node.inputs[1])
    if target is None:
        return None
    target = [int(d) for d in target.reshape(-1)]
    if node.attrs["allowzero"] or 0 not in target:
        return np.array(target, np.int64)
    out_shape = graph.values[node.outputs[0]].shape
    x_shape = graph.values[x].shape
    new, unknown = [], 0
    for i, d in enumerate(out_shape):
        if isinstance(d, int):
            new.append(d)
        elif i < len(x_shape) and x_shape[i] == d:
            new.append(0)
        else:
            unknown += 1
            new.append(-1)
    if unknown > 1:
        return None
    return np.array(new, np.int64)


def _simplify_once(graph) -> int:
    changes = 0
    producers = graph.producers()
    for node in list(graph.nodes):
        if node not in graph.nodes:
            continue
        x = node.inputs[0] if node.inputs else ""
        if not x:
            continue
        x_shape = graph.values[x].shape
        out = node.outputs[0]
        out_shape = graph.values[out].shape
        if node.op in RESHAPES and tuple(x_shape) == tuple(out_shape):
            if bypass(graph, node, x, out):
                changes += 1
                producers = graph.producers()
            continue
        if node.op == "Transpose":
            perm = _perm(node, len(x_shape))
            if perm == list(range(len(perm))):
                if bypass(graph, node, x, out):
                    changes += 1
                    producers = graph.producers()
                continue
            first = producers.get(x)
            if first is not None and first.op == "Transpose":
                src = first.inputs[0]
                p1 = _perm(first, len(graph.values[src].shape))
                node.attrs["perm"] = [p1[p] for p in perm]
                node.inputs[0] = src
                changes += 1
            continue
        if node.op == "Reshape":
            first = producers.get(x)
            if first is not None and first.op in RESHAPES:
                src = first.inputs[0]
                target = _chain_target(graph, node, src)
                if target is None:
                    continue
                old = const(graph, node.inputs[1])
                if old is None or old.reshape(-1).tolist() != target.tolist():
                    node.inputs[1] = new_const(graph, f"{node.name}/target", target)
                node.inputs[0] = src
                changes += 1
    return changes


@register_pass("simplify_layout",
               "no-op Reshape/Transpose removed, Transpose pairs composed, Reshape chains collapsed")
def simplify_layout(graph) -> int:
    total = 0
    while True:
        changes = _simplify_once(graph)
        if not changes:
            break
        total += changes
        prune(graph)
    prune(graph)
    return total
