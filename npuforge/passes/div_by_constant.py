"""Division by a float constant becomes multiplication by its reciprocal.

Attention scores divided by sqrt(d), a mean divided by a count, a HardSwish
divided by 6: as Mul they quantize (Mul is an "elementwise" op with a
fixed-point rule; Div has none) and fold into the patterns
recognize_activations knows. ``x / c`` and ``x * (1 / c)`` differ by at most one
rounding of the float result. Integer division keeps its truncation, so only
float constants are rewritten; a divisor of 0 stays (division by zero is the
model's own behaviour).
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes
from .manager import register_pass
from .rewrite import const, prune


@register_pass("div_by_constant", "Div by a float constant -> Mul by its reciprocal (so it quantizes)")
def div_by_constant(graph) -> int:
    changes = 0
    for node in graph.nodes:
        if node.op != "Div" or graph.values[node.outputs[0]].dtype not in dtypes.FLOAT_DTYPES:
            continue
        c = const(graph, node.inputs[1])
        if c is None or not np.all(np.isfinite(c)) or np.any(c == 0):
            continue
        inverse = graph.add_const(graph.unique_name(f"{node.inputs[1]}::reciprocal"),
                                  (np.ones((), c.dtype) / c).astype(c.dtype))
        node.op, node.inputs = "Mul", [node.inputs[0], inverse.name]
        changes += 1
    prune(graph)
    return changes
