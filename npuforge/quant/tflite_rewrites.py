"""Float-graph rewrites before quantizing for the TFLite export (``target='tflite'``).

npuforge fuses a LeakyRelu into the Conv / Gemm before it and requantizes negative
accumulators with a second multiplier; TFLite has no fused LeakyRelu, so that integer
program has no TFLite form. Quantizing for TFLite splits the activation off again:
the convolution then gets its own output grid and the LeakyRelu becomes a table
(LiteRT's LEAKY_RELU arithmetic, quant/tflite_tables.py), both of which the export
writes as they are.
"""

from __future__ import annotations

from ..ir.graph import Node, Value


def split_fused_leaky_relu(graph) -> int:
    """Every Conv / Gemm with a fused LeakyRelu becomes the op and a LeakyRelu node, in place;
    -> how many were split."""
    split = 0
    for index in reversed(range(len(graph.nodes))):
        node = graph.nodes[index]
        if node.attrs.get("activation") != "LeakyRelu":
            continue
        y = graph.values[node.outputs[0]]
        pre = graph.add_value(Value(graph.unique_name(f"{node.name}::pre_activation"), y.dtype, y.shape))
        alpha = float(node.attrs["activation_params"][0])
        node.attrs["activation"], node.attrs["activation_params"] = "", []
        graph.nodes.insert(index + 1, Node(f"{node.name}::leaky_relu", "LeakyRelu", [pre.name], [y.name],
                                           {"alpha": alpha}))
        node.outputs = [pre.name]
        split += 1
    return split
