"""IR -> ONNX (opset 21), float or QDQ.

QDQ: every quantized activation is written as QuantizeLinear -> DequantizeLinear
right after its producer; weights and biases are stored as integers (int8 /
int32) behind a DequantizeLinear, per channel where they are. ONNX Runtime fuses
those patterns into its integer kernels; the numbers are the fake-quant ones.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..ir import dtypes
from ..ops.registry import get_op

OPSET = 21


def _value_info(graph, name: str, onnx_name: str | None = None) -> onnx.ValueInfoProto:
    v = graph.values[name]
    return helper.make_tensor_value_info(onnx_name or name, dtypes.to_onnx(v.dtype), list(v.shape))


def _nodes_of(graph, node) -> list:
    """ONNX nodes for one IR node: the op's own ``onnx_nodes`` if it has one, else the attributes as they are."""
    op = get_op(node.op)
    custom = getattr(op, "onnx_nodes", None)
    if custom is not None:
        return custom(node)
    attrs = {k: v for k, v in node.attrs.items() if v is not None and v != []}
    return [helper.make_node(node.op, node.inputs, node.outputs, name=node.name, **attrs)]


METADATA_KEY = "npuforge"


def _model(graph, nodes, initializers, inputs, outputs) -> onnx.ModelProto:
    import json

    g = helper.make_graph(nodes, graph.name, inputs, outputs, initializers)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="npuforge")
    model.ir_version = 10
    if graph.metadata:
        helper.set_model_props(model, {METADATA_KEY: json.dumps(graph.metadata, sort_keys=True)})
    return model


def to_onnx(graph) -> onnx.ModelProto:
    """The float graph as plain ONNX."""
    nodes = [n for node in graph.nodes for n in _nodes_of(graph, node)]
    used = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    inits = [numpy_helper.from_array(np.asarray(v.data), v.name) for v in graph.constants() if v.name in used]
    return _model(graph, nodes, inits, [_value_info(graph, n) for n in graph.inputs],
                  [_value_info(graph, n) for n in graph.outputs])


def _qparams_inits(prefix: str, p) -> tuple[list, str, str]:
    zp = p.zero_point.astype(dtypes.to_numpy(p.dtype))
    scale_name, zp_name = f"{prefix}::scale", f"{prefix}::zero_point"
    return [numpy_helper.from_array(p.scale, scale_name), numpy_helper.from_array(zp, zp_name)], scale_name, zp_name


def to_qdq_onnx(graph) -> onnx.ModelProto:
    """The quantized graph as ONNX QDQ."""
    inits, nodes = [], []
    # constants: quantized ones become integer initializers behind a DequantizeLinear;
    # the node-level integers (requantization, tables) have no place in QDQ
    used = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    for v in graph.constants():
        if v.name not in used:
            continue
        if v.quant is None:
            inits.append(numpy_helper.from_array(np.asarray(v.data), v.name))
            continue
        q = v.quant
        extra, s, z = _qparams_inits(v.name, q)
        inits += extra + [numpy_helper.from_array(q.quantize(v.data), f"{v.name}::q")]
        axis = {} if q.axis is None else {"axis": q.axis}
        nodes.append(helper.make_node("DequantizeLinear", [f"{v.name}::q", s, z], [v.name],
                                      name=f"{v.name}::dq", **axis))
    # activations: a producer writes NAME::f and Q/DQ turn it into NAME for the
    # consumers; a graph input keeps its name and its consumers read NAME::dq
    quantized = {n for n, v in graph.values.items() if v.quant is not None and not v.is_const}
    produced = {n: f"{n}::f" for n in quantized if n not in graph.inputs}
    read = {n: f"{n}::dq" for n in quantized if n in graph.inputs}

    def qdq(src: str, name: str, dst: str) -> list:
        extra, s, z = _qparams_inits(name, graph.values[name].quant)
        inits.extend(extra)
        return [helper.make_node("QuantizeLinear", [src, s, z], [f"{name}::q"], name=f"{name}::quantize"),
                helper.make_node("DequantizeLinear", [f"{name}::q", s, z], [dst], name=f"{name}::dequantize")]

    for name in graph.inputs:
        if name in read:
            nodes += qdq(name, name, read[name])
    for node in graph.nodes:
        for n in _nodes_of(graph, node):
            n.input[:] = [read.get(i, i) for i in n.input]
            n.output[:] = [produced.get(o, o) for o in n.output]
            nodes.append(n)
        for out in node.outputs:
            if out in produced:
                nodes += qdq(produced[out], out, out)
    inputs = [_value_info(graph, name) for name in graph.inputs]
    return _model(graph, nodes, inits, inputs, [_value_info(graph, n) for n in graph.outputs])
