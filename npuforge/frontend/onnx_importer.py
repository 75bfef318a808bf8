"""ONNX (opsets 13 to 21; 9 to 12 upgraded to 13 on the way in) -> npuforge IR.

Each node is converted by its op's ``from_onnx`` and shape-inferred at once, so
later nodes (auto_pad, static shape subgraphs) see their inputs' shapes and
known values. Anything outside the covered ops and attributes is an error that
names the node.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelFormatError, NpuforgeError, UnsupportedError
from ..ir import dtypes
from ..ir.graph import Graph, Node, Value
from ..ir.infer import check_arity, check_size, infer_node, input_infos
from ..ops.registry import REQUIRED, TensorInfo, check_attr_values, get_op

OPSETS = range(13, 22)
UPGRADABLE_OPSETS = range(9, 13)  # imported through onnx's version converter to opset 13
_DEFAULT_DOMAINS = ("", "ai.onnx")


class ImportContext:
    def __init__(self, graph: Graph, opset: int, where: str):
        self.graph = graph
        self.opset = opset
        self.where = where
        self.infos: dict[str, TensorInfo] = {}

    def info(self, name: str) -> TensorInfo | None:
        return self.infos[name] if name else None

    def add_const(self, base: str, data: np.ndarray) -> str:
        name = self.graph.unique_name(base)
        v = self.graph.add_const(name, data)
        self.infos[name] = TensorInfo(v.dtype, v.shape, v.data)
        return name


def _read_model(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise ModelFormatError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError and friends
        raise ModelFormatError(
            f"{path}: not a readable ONNX model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'parse error'}); "
            "the file may be truncated or corrupt"
        ) from None
    from onnx.external_data_helper import uses_external_data

    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            if not (path.parent / location).is_file():
                raise ModelFormatError(
                    f"{path}: initializer '{tensor.name}' keeps its data in '{location}', which is missing "
                    f"next to the model; copy it to {path.parent}"
                )
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    except Exception as e:
        raise ModelFormatError(f"{path}: cannot read external data ({e})") from None
    return model


def _check_model(model: onnx.ModelProto, where: str) -> int:
    # No onnx.checker here: it rejects models ONNX Runtime runs (outputs without
    # a type, say). The import itself checks every reference, attribute and shape.
    if not model.graph.node:
        raise ModelFormatError(f"{where}: the ONNX graph has no nodes; the file may be truncated or empty")
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), None)
    if opset is None:
        raise ModelFormatError(f"{where}: the model declares no default-domain opset")
    if opset not in OPSETS and opset not in UPGRADABLE_OPSETS:
        raise UnsupportedError(
            f"{where}: opset {opset} is not supported (opsets {UPGRADABLE_OPSETS.start} to {OPSETS.stop - 1}); "
            "re-export the model with opset_version=17"
        )
    return opset


def _upgrade(model: onnx.ModelProto, opset: int, where: str) -> onnx.ModelProto:
    """An opset 9-12 model rewritten to opset 13 by the onnx package's version converter
    (Split / Squeeze / Unsqueeze axes become inputs, Upsample becomes Resize, 2-D
    Softmax is made explicit, ...); the ops' own import rules take it from there."""
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, OPSETS.start)
    except Exception as e:  # the converter raises RuntimeError / ConvertError with C++ text
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsupportedError(
            f"{where}: opset {opset} could not be upgraded to opset {OPSETS.start} ({reason}); "
            "re-export the model with opset_version=17"
        ) from None


def _attr_value(attr: onnx.AttributeProto, where: str):
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS,
                     onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
        raise UnsupportedError(f"{where}: attribute '{attr.name}' of this kind (subgraph or sparse) is not supported")
    value = onnx.helper.get_attribute_value(attr)
    try:
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isinstance(value, list):
            return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    except UnicodeDecodeError:
        raise ModelFormatError(f"{where}: string attribute '{attr.name}' is not UTF-8 text; "
                               "re-export the model") from None
    return value


def _constant_data(node: onnx.NodeProto, where: str) -> np.ndarray:
    if len(node.attribute) != 1:
        raise ModelFormatError(f"{where}: Constant must have exactly one value attribute")
    attr = node.attribute[0]
    value = _attr_value(attr, where)
    if attr.name == "value":
        return numpy_helper.to_array(value)
    if attr.name == "value_float":
        return np.array(value, np.float32)
    if attr.name == "value_floats":
        return np.array(value, np.float32)
    if attr.name == "value_int":
        return np.array(value, np.int64)
    if attr.name == "value_ints":
        return np.array(value, np.int64)
    raise UnsupportedError(f"{where}: Constant attribute '{attr.name}' is not supported")


def _input_value(vi: onnx.ValueInfoProto, where: str) -> Value:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedError(f"{where}: graph input '{vi.name}' is not a tensor")
    if not t.HasField("shape"):
        raise UnsupportedError(f"{where}: graph input '{vi.name}' has no shape; export it with a fixed rank")
    dims = []
    for k, d in enumerate(t.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(f"{vi.name}_dim{k}")
    check_size(vi.name, dims, f"{where}: graph input")
    return Value(vi.name, dtypes.from_onnx(t.elem_type, f"{where}: graph input '{vi.name}'"), tuple(dims))


def _sorted_nodes(nodes, known: set, where: str) -> list:
    """ONNX requires topological order; accept any order and report cycles."""
    ready_names = set(known)
    pending = list(nodes)
    out = []
    while pending:
        rest = []
        for n in pending:
            if all(not i or i in ready_names for i in n.input):
                out.append(n)
                ready_names.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            n = rest[0]
            missing = [i for i in n.input if i and i not in ready_names]
            producers = {o for m in rest for o in m.output}
            if all(m in producers for m in missing):
                names = ", ".join(repr(m.name or m.op_type) for m in rest[:6])
                raise ModelFormatError(f"{where}: the graph has a cycle through nodes {names}")
            raise ModelFormatError(
                f"{where}: node '{n.name or n.op_type}' ({n.op_type}) reads '{missing[0]}', "
                "which no node, input or initializer provides (is the file truncated?)"
            )
        pending = rest
    return out


def _fix_input_shapes(graph: Graph, shapes: dict, where: str) -> None:
    """Give graph inputs the sizes the user chose (``--input-shape``): each dim an int,
    or a name to keep that axis symbolic (the batch ``N``, say); a fixed dim the model
    declares must be kept."""
    for name, dims in shapes.items():
        if name == "" and len(graph.inputs) == 1:  # NAME= left out on a one-input model
            name = graph.inputs[0]
        if name not in graph.inputs:
            what = f"names '{name}', which is not a graph input" if name else "needs NAME= (several inputs)"
            raise NpuforgeError(f"{where}: --input-shape {what}; inputs: {', '.join(graph.inputs)}")
        v = graph.values[name]
        dims = tuple(dims)
        if len(dims) != len(v.shape):
            raise NpuforgeError(f"{where}: --input-shape {name} gives {len(dims)} dims but the input has rank "
                                f"{len(v.shape)} ({list(v.shape)})")
        for k, (old, new) in enumerate(zip(v.shape, dims)):
            if isinstance(old, int) and old != new:
                raise NpuforgeError(f"{where}: --input-shape {name}: dim {k} is fixed at {old} in the model, "
                                    f"not {new}")
        v.shape = dims


def import_onnx(model, name: str | None = None, input_shapes: dict | None = None) -> Graph:
    """An ONNX file path or ModelProto -> a checked npuforge Graph.

    ``input_shapes``: {input name: dims} fixing dynamic input dimensions before the
    import (ints; a string keeps a dim symbolic), e.g. ``{"images": (1, 3, 640, 640)}``.
    """
    if isinstance(model, (str, os.PathLike)):
        where = str(model)
        model = _read_model(Path(model))
    else:
        where = name or "<onnx model>"
    opset = _check_model(model, where)
    if opset in UPGRADABLE_OPSETS:
        model = _upgrade(model, opset, where)
        opset = OPSETS.start
    g = model.graph
    graph = Graph(name or g.name or "graph")
    ctx = ImportContext(graph, opset, where)

    for init in g.initializer:
        try:
            data = numpy_helper.to_array(init)
        except Exception as e:
            raise ModelFormatError(f"{where}: initializer '{init.name}' cannot be read ({e})") from None
        ctx.infos[init.name] = TensorInfo(dtypes.from_numpy(data.dtype), tuple(data.shape), data)
        graph.add_value(Value(init.name, dtypes.from_numpy(data.dtype), tuple(data.shape), data))
    if g.sparse_initializer:
        raise UnsupportedError(f"{where}: sparse initializers are not supported")
    for vi in g.input:
        if vi.name in graph.values:
            continue  # an initializer listed as input (IR version < 4): a constant
        v = graph.add_value(_input_value(vi, where))
        graph.inputs.append(v.name)
    _fix_input_shapes(graph, input_shapes or {}, where)
    for name_ in graph.inputs:
        ctx.infos[name_] = TensorInfo(graph.values[name_].dtype, graph.values[name_].shape)

    used_names = set()
    for index, onode in enumerate(_sorted_nodes(g.node, set(ctx.infos), where)):
        node_name = onode.name or f"{onode.op_type}_{index}"
        if node_name in used_names:
            node_name = f"{node_name}_{index}"
        used_names.add(node_name)
        at = f"{where}: node '{node_name}' ({onode.op_type})"
        if onode.domain not in _DEFAULT_DOMAINS:
            raise UnsupportedError(f"{at}: domain '{onode.domain}' is not supported; only standard ONNX ops are")
        if onode.op_type == "Constant":
            data = _constant_data(onode, at)
            graph.add_const(onode.output[0], data)
            ctx.infos[onode.output[0]] = TensorInfo(dtypes.from_numpy(data.dtype), tuple(data.shape), data)
            continue
        try:
            op = get_op(onode.op_type)
        except UnsupportedError as e:
            raise UnsupportedError(f"{where}: node '{node_name}': {e}") from None
        attrs = {}
        for attr in onode.attribute:
            if attr.name not in op.attrs and attr.name not in op.onnx_only_attrs:
                raise UnsupportedError(
                    f"{at}: attribute '{attr.name}' is not supported; supported: {', '.join(op.attrs) or 'none'}"
                )
            attrs[attr.name] = _attr_value(attr, at)
        for key, default in op.attrs.items():
            if key not in attrs:
                if default is REQUIRED:
                    raise ModelFormatError(f"{at}: required attribute '{key}' is missing")
                attrs[key] = copy.deepcopy(default)
        inputs = list(onode.input)
        while inputs and not inputs[-1]:
            inputs.pop()  # trailing omitted optional inputs
        outputs = list(onode.output)
        while outputs and not outputs[-1]:
            outputs.pop()
        node = Node(node_name, onode.op_type, inputs, outputs, attrs)
        try:
            check_arity(op, node)
            check_attr_values(op, node)  # before from_onnx: it reads them
            op.from_onnx(ctx, node)
            outs = infer_node(node, input_infos(node, ctx.infos))
        except NpuforgeError as e:
            raise type(e)(f"{where}: {e}") from None
        for out_name, info in zip(node.outputs, outs):
            ctx.infos[out_name] = info
            graph.add_value(Value(out_name, info.dtype, tuple(info.shape)))
        graph.nodes.append(node)

    if not g.output:
        raise ModelFormatError(f"{where}: the graph has no outputs; a model must name at least one")
    for vo in g.output:
        if vo.name not in graph.values:
            raise ModelFormatError(f"{where}: graph output '{vo.name}' is not produced by any node")
        graph.outputs.append(vo.name)
    for prop in model.metadata_props:
        if prop.key == "npuforge":  # written by npuforge's exporter: preprocessing and the like
            import json

            try:
                meta = json.loads(prop.value)
            except ValueError:
                meta = None
            graph.metadata = meta if isinstance(meta, dict) else {}  # (an unreadable record is no record)
    graph.check()
    return graph
