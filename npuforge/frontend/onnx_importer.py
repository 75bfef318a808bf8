"""ONNX (opsets 13 to 21; 9 to 12 upgraded to 13 on the way in) -> npuforge IR.

Each node is converted by its op's ``from_onnx`` and shape-inferred at once, so
later nodes (auto_pad, static shape subgraphs) see their inputs' shapes and
known values. Anything outside the covered ops and attributes is an error that
names the node.

If and Loop are folded at import: an If whose condition is known then (a constant, or
shape arithmetic once the input sizes are fixed) becomes the taken branch's nodes (one
decided by data becomes both branches and a Where per output), a
Loop whose trip count and conditions are known is unrolled (its body's nodes once per
iteration, scan outputs stacked by Unsqueeze + Concat). Inlined values are renamed
``<node>/<name>`` (``<node>/iter<k>/<name>`` in a Loop) and the body's outputs take the
node's output names. When what decides them is not known, the error names the node and
the graph input it depends on. LSTM, GRU and RNN are unrolled over their sequence length
(frontend/onnx_recurrent.py).
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
from ..ops.registry import REQUIRED, TensorInfo, all_ops, check_attr_values, get_op
from .onnx_recurrent import RECURRENT_OPS, unroll_recurrent

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
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(d.dim_param)
        else:  # no size, or -1 / 0: how several exporters mark a dynamic dim (the batch)
            dims.append(f"{vi.name}_dim{k}")
    check_size(vi.name, dims, f"{where}: graph input")
    return Value(vi.name, dtypes.from_onnx(t.elem_type, f"{where}: graph input '{vi.name}'"), tuple(dims))


class _Known:
    """Names available to a body's nodes: its own, and the enclosing graph's that it does not redefine
    (a view, not a copy: a Loop unrolls its body many times over a growing graph)."""

    def __init__(self, own: set, outer: dict, hidden: set):
        self.own, self.outer, self.hidden = own, outer, hidden

    def __contains__(self, name) -> bool:
        return name in self.own or (name in self.outer and name not in self.hidden)

    def update(self, names) -> None:
        self.own.update(names)


def _sorted_nodes(nodes, known, where: str) -> list:
    """ONNX requires topological order; accept any order and report cycles."""
    ready_names = known if isinstance(known, _Known) else set(known)
    pending = list(nodes)
    out = []
    while pending:
        rest = []
        for n in pending:
            if all(not i or i in ready_names for i in _reads(n)):
                out.append(n)
                ready_names.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            n = rest[0]
            missing = [i for i in _reads(n) if i and i not in ready_names]
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


def _fix_input_value(graph: Graph, name: str, value, where: str) -> None:
    """``--input-value``: graph input ``name`` becomes a constant of its own dtype and declared
    shape holding ``value`` (a scalar for a 0-d input; the values fill the shape, row-major; a
    dynamic dim of a 1-d input takes the value count; an array already of the input's rank keeps
    its shape where the input's dims are dynamic)."""
    v = graph.values[name]
    opt = f"{where}: --input-value {name}"
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise NpuforgeError(f"{opt}: {arr.dtype} values are not numbers")
    dtype = np.dtype(dtypes.to_numpy(v.dtype))
    shape = tuple(v.shape)
    if arr.ndim == len(shape) and arr.ndim > 1 and all(not isinstance(d, int) or d == n
                                                      for d, n in zip(shape, arr.shape)):
        shape = arr.shape  # an array of the input's own shape (the Python API)
    elif len(shape) == 1 and not isinstance(shape[0], int):
        shape = (arr.size,)  # a dynamic 1-d input: as many as given
    elif not all(isinstance(d, int) for d in shape):
        raise NpuforgeError(f"{opt}: the input's shape {list(shape)} has dynamic dims; give the value as an "
                            f"array of the input's rank (input_shapes= in the Python API) to fix them")
    count = int(np.prod(shape, dtype=np.int64))
    if arr.size != count:
        raise NpuforgeError(f"{opt}: {'too many' if arr.size > count else 'too few'} values: {arr.size} given, "
                            f"but the input ({v.dtype}{list(shape)}) holds {count}")
    flat = arr.reshape(-1)
    if dtype.kind in "biu":
        if arr.dtype.kind == "f" and not np.all(np.isfinite(flat) & (flat == np.round(flat))):
            bad = next(x for x in flat if not (np.isfinite(x) and x == np.round(x)))
            raise NpuforgeError(f"{opt}: {bad:g} is not an integer, and the input is {v.dtype}")
        lo, hi = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        out = [x for x in flat.tolist() if not lo <= x <= hi]
        if out:
            raise NpuforgeError(f"{opt}: {out[0]} is out of the range of the input's dtype {v.dtype} "
                                f"({lo} to {hi})")
    v.data = flat.astype(dtype).reshape(shape)
    v.shape = tuple(int(d) for d in shape)
    graph.inputs.remove(name)


def _fix_input_shapes(graph: Graph, shapes: dict, where: str) -> list:
    """Give graph inputs the sizes the user chose (``--input-shape``): each dim an int,
    a name to keep that axis symbolic (the batch ``N``, say), or -1 (None) to keep the
    model's dim as it is; a fixed dim the model declares must be kept. An entry whose value
    is a NumPy array (``--input-value``) makes the input that constant (:func:`_fix_input_value`).
    Returns the names of the inputs so fixed: constants now, no longer graph inputs."""
    fixed_values = []
    inputs = list(graph.inputs)
    for name, dims in shapes.items():
        is_value = isinstance(dims, (np.ndarray, np.generic))
        option = "--input-value" if is_value else "--input-shape"
        if name == "" and len(inputs) == 1:  # NAME= left out on a one-input model
            name = inputs[0]
        if name not in inputs:
            what = f"names '{name}', which is not a graph input" if name else "needs NAME= (several inputs)"
            raise NpuforgeError(f"{where}: {option} {what}; inputs: {', '.join(inputs)}")
        if is_value:
            _fix_input_value(graph, name, dims, where)
            fixed_values.append(name)
            continue
        v = graph.values[name]
        dims = tuple(dims)
        if len(dims) != len(v.shape):
            raise NpuforgeError(f"{where}: --input-shape {name} gives {len(dims)} dims but the input has rank "
                                f"{len(v.shape)} ({list(v.shape)})")
        fixed = []
        for k, (old, new) in enumerate(zip(v.shape, dims)):
            if new is None or (isinstance(new, (int, np.integer)) and not isinstance(new, bool) and new == -1):
                fixed.append(old)  # -1: as the model has it
                continue
            if isinstance(new, str) and new.strip():
                new = new.strip()
            elif not isinstance(new, (int, np.integer)) or isinstance(new, bool) or new < 1:
                raise NpuforgeError(f"{where}: --input-shape {name}: dim {k} is {new!r}; give a positive size, -1 "
                                    f"to keep the model's dim, or a name such as N to keep it dynamic")
            else:
                new = int(new)
            if isinstance(old, int) and old != new:
                raise NpuforgeError(f"{where}: --input-shape {name}: dim {k} is fixed at {old} in the model, "
                                    f"not {new}")
            fixed.append(new)
        v.shape = tuple(fixed)
    return fixed_values


# If and Loop: folded at import when what decides them is known then
MAX_UNROLL = 1024  # Loop iterations unrolled at most
MAX_INLINED = 200_000  # nodes inlined from If / Loop bodies at most


def _subgraphs(node) -> list:
    out = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def _outer_reads(g: onnx.GraphProto) -> set:
    """The names a subgraph (and the subgraphs inside it) reads from enclosing scopes."""
    defined = {i.name for i in g.input} | {i.name for i in g.initializer} | {o for n in g.node for o in n.output}
    reads = {o.name for o in g.output}
    for n in g.node:
        reads.update(i for i in n.input if i)
        for sub in _subgraphs(n):
            reads |= _outer_reads(sub)
    return reads - defined


def _reads(node) -> list:
    """What a node reads: its inputs, and for If / Loop the outer values its bodies read."""
    subs = _subgraphs(node)
    if not subs:
        return list(node.input)
    return list(node.input) + sorted(set().union(*(_outer_reads(s) for s in subs)))


def _all_names(g: onnx.GraphProto, into: set) -> set:
    into.update(i.name for i in g.input)
    into.update(i.name for i in g.initializer)
    into.update(o.name for o in g.output)
    for n in g.node:
        into.update(n.input)
        into.update(n.output)
        for sub in _subgraphs(n):
            _all_names(sub, into)
    return into


def _rename_refs(g: onnx.GraphProto, rename: dict) -> None:
    """Rewrite, in a subgraph nested in an inlined body, the references to the body's renamed values."""
    for n in g.node:
        n.input[:] = [rename.get(i, i) for i in n.input]
        for sub in _subgraphs(n):
            _rename_refs(sub, rename)
    for o in g.output:
        o.name = rename.get(o.name, o.name)


MAX_FOLDED = 1 << 24  # elements of a weight computed from constants at import (folded)
MAX_FOLD_DEPTH = 64  # nodes between such a weight and its initializers


class _OnnxImporter:
    def __init__(self, model: onnx.ModelProto, graph: Graph, ctx: ImportContext, where: str):
        self.graph, self.ctx, self.where = graph, ctx, where
        self.used_nodes: set = set()
        self.taken = _all_names(model.graph, set())  # no name made here may be one the model uses
        self.producers: dict[str, tuple] = {}  # value -> (op type, inputs): what a condition depends on
        self.inlined = 0
        self.decided: set = set()  # the conditions and trip counts of folded If / Loop nodes

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken or name in self.graph.values:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def const(self, base: str, data: np.ndarray) -> str:
        name = self.fresh(base)
        self.graph.add_const(name, data)
        self.ctx.infos[name] = TensorInfo(dtypes.from_numpy(data.dtype), tuple(data.shape), data)
        return name

    def node_name(self, onode, index) -> str:
        name = onode.name or f"{onode.op_type}_{index}"
        if name in self.used_nodes:
            name = f"{name}_{index}"
        while name in self.used_nodes:
            name += "_"
        self.used_nodes.add(name)
        return name

    # -- one node ------------------------------------------------------------------------
    def convert(self, onode, node_name: str) -> None:
        ctx, graph, where = self.ctx, self.graph, self.where
        at = f"{where}: node '{node_name}' ({onode.op_type})"
        if onode.domain not in _DEFAULT_DOMAINS:
            raise UnsupportedError(f"{at}: domain '{onode.domain}' is not supported; only standard ONNX ops are")
        if onode.op_type == "Constant":
            data = _constant_data(onode, at)
            graph.add_const(onode.output[0], data)
            ctx.infos[onode.output[0]] = TensorInfo(dtypes.from_numpy(data.dtype), tuple(data.shape), data)
            return
        if onode.op_type == "If":
            return self.fold_if(onode, node_name, at)
        if onode.op_type == "Loop":
            return self.unroll_loop(onode, node_name, at)
        if onode.op_type in RECURRENT_OPS:
            return unroll_recurrent(self, onode, node_name, at, {a.name: _attr_value(a, at) for a in onode.attribute})
        if onode.op_type not in all_ops():
            raise UnsupportedError(f"{at}: op '{onode.op_type}' is not supported; `npuforge ops` lists the "
                                   f"{len(all_ops())} ops npuforge imports")
        op = get_op(onode.op_type)
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
        for i in inputs:
            if i and i not in ctx.infos:  # (inlined bodies: a name the body defines after reading it)
                raise ModelFormatError(f"{at}: reads '{i}', which no node, input or initializer before it provides")
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
            self.producers[out_name] = (node.op, list(node.inputs))
        graph.nodes.append(node)

    def prune(self) -> None:
        """Drop the nodes that only computed the conditions of folded If / Loop nodes."""
        g = self.graph
        while True:
            read = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
            dead = {id(n) for n in g.nodes if all(o not in read for o in n.outputs) and
                    any(o in self.decided for o in n.outputs)}
            if not dead:
                break
            for n in g.nodes:
                if id(n) in dead:
                    self.decided.update(n.inputs)
            g.nodes = [n for n in g.nodes if id(n) not in dead]
        read = {i for n in g.nodes for i in n.inputs} | set(g.outputs) | set(g.inputs)
        made = {o for n in g.nodes for o in n.outputs}
        for name in self.decided:
            if name and name not in read and name not in made and name in g.values:
                del g.values[name]

    def emit(self, op_type: str, inputs: list, outputs: list, name: str, **attrs) -> None:
        self.convert(onnx.helper.make_node(op_type, inputs, outputs, **attrs),
                     self.node_name(onnx.NodeProto(name=name), 0))

    # -- If and Loop: inlined bodies -----------------------------------------------------------------
    def body(self, onode, attr: str, at: str) -> onnx.GraphProto:
        found = [a for a in onode.attribute if a.name == attr and a.type == onnx.AttributeProto.GRAPH]
        if not found:
            raise ModelFormatError(f"{at}: the subgraph attribute '{attr}' is missing")
        return found[0].g

    def inline(self, body: onnx.GraphProto, prefix: str, bind: dict, out_names: list | None, at: str) -> list:
        """Convert a body's nodes into the graph, its inputs bound to IR values (``bind``), its
        initializers constants, every value it defines renamed (``prefix/...``, or the names in
        ``out_names`` for its outputs); returns the IR values of its outputs."""
        if len(bind) != len(body.input):
            raise ModelFormatError(f"{at}: its body '{body.name}' has {len(body.input)} inputs, expected "
                                   f"{len(bind)}")
        if out_names is not None and len(out_names) != len(body.output):
            raise ModelFormatError(f"{at}: its body '{body.name}' has {len(body.output)} outputs, but the node "
                                   f"has {len(out_names)}")
        rename = dict(bind)
        for init in body.initializer:
            try:
                data = numpy_helper.to_array(init)
            except Exception as e:
                raise ModelFormatError(f"{at}: initializer '{init.name}' of its body cannot be read ({e})") from None
            rename[init.name] = self.const(f"{prefix}/{init.name}", data)
        produced = {o for n in body.node for o in n.output if o}
        direct = {}  # body output -> the node's own output name, when a body node makes it (once)
        if out_names is not None:
            for o, target in zip(body.output, out_names):
                if o.name in produced and o.name not in direct and target:
                    direct[o.name] = target
        for o in sorted(produced):
            rename[o] = direct.get(o) or self.fresh(f"{prefix}/{o}")
        self.inlined += len(body.node)
        if self.inlined > MAX_INLINED:
            raise UnsupportedError(f"{at}: its bodies inline more than {MAX_INLINED} nodes; npuforge folds If "
                                   f"and unrolls Loop only up to that size")
        # (a body value named like an outer one hides it inside the body)
        known = _Known(set(bind) | {i.name for i in body.initializer}, self.ctx.infos, produced)
        for index, n in enumerate(_sorted_nodes(body.node, known, f"{at}, in its body")):
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.input[:] = [rename.get(i, i) if i else "" for i in n.input]
            m.output[:] = [rename.get(o, o) if o else "" for o in n.output]
            for sub in _subgraphs(m):
                _rename_refs(sub, rename)
            m.name = f"{prefix}/{n.name or f'{n.op_type}_{index}'}"
            self.convert(m, self.node_name(m, index))
        outs = [rename.get(o.name, o.name) for o in body.output]
        for o in outs:
            if o not in self.ctx.infos:
                raise ModelFormatError(f"{at}: its body '{body.name}' outputs '{o}', which nothing in it or "
                                       f"around it provides")
        if out_names is None:
            return outs
        for k, (src, target) in enumerate(zip(outs, out_names)):
            if target and src != target:  # an outer value, an initializer, or an output named twice
                self.emit("Identity", [src], [target], f"{prefix}/output_{k}")
        return list(out_names)

    def known(self, name: str):
        info = self.ctx.infos.get(name)
        if info is None or info.value is None or np.asarray(info.value).dtype == object:
            return None
        return np.asarray(info.value)

    def folded(self, name: str, depth: int = 0):
        """``name``'s value if it is computed from constants alone (an LSTM's weights sliced and
        concatenated from one initializer, too large for import-time propagation), computed now
        by the IR nodes already converted; None if a graph input reaches it, past MAX_FOLD_DEPTH
        nodes, or beyond MAX_FOLDED elements."""
        value = self.known(name)
        if value is not None or depth > MAX_FOLD_DEPTH:
            return value
        node = next((n for n in reversed(self.graph.nodes) if name in n.outputs), None)
        if node is None:
            return None
        ins = [self.folded(i, depth + 1) if i else None for i in node.inputs]
        if any(i and v is None for i, v in zip(node.inputs, ins)):
            return None
        try:
            import torch

            with torch.no_grad():
                ys = get_op(node.op).forward(node, [None if v is None else torch.from_numpy(np.array(v)) for v in ins])
        except (NpuforgeError, RuntimeError, ValueError, TypeError):
            return None
        y = ys[node.outputs.index(name)].numpy()
        return y if y.size <= MAX_FOLDED else None

    def known_scalar(self, name: str, at: str, what: str):
        """The one-element value of ``name`` known at import (a condition, a trip count), or the refusal."""
        value = self.known(name)
        if value is None or value.size != 1:
            raise self.undecided(at, what, name)
        return value.reshape(-1)[0]

    def deciding_inputs(self, name: str) -> tuple[list, list]:
        """The graph inputs an unknown ``name`` depends on: through their values, and through their sizes."""
        values, sizes, seen, stack = [], [], set(), [(name, False)]
        while stack:
            v, via_shape = stack.pop()
            if (v, via_shape) in seen:
                continue
            seen.add((v, via_shape))
            if v in self.graph.inputs:
                (sizes if via_shape else values).append(v)
                continue
            op, ins = self.producers.get(v, (None, []))
            for i in ins:
                if i and (op in ("Shape", "Size") or self.known(i) is None):
                    stack.append((i, via_shape or op in ("Shape", "Size")))
        return values, sizes

    def undecided(self, at: str, what: str, name: str) -> UnsupportedError:
        """A one-line refusal: ``what`` ('name') is not known at import, and the graph inputs it depends on."""
        values, sizes = self.deciding_inputs(name)
        op = at.rsplit("(", 1)[-1].rstrip(")")
        rule = f"npuforge imports {op} only when {what.replace('its ', 'the ')} is known at import"
        if values:
            because = f"it depends on the values of the graph input '{sorted(set(values))[0]}'; {rule}"
        elif sizes:
            x = sorted(set(sizes))[0]
            dims = list(self.graph.values[x].shape)
            because = (f"it depends on the dynamic size of the graph input '{x}' {dims}; fix it with --input-shape "
                       f"{x}={','.join(str(d) if isinstance(d, int) else 'D' for d in dims)} (input_shapes= in "
                       f"the Python API)")
        else:
            because = rule
        return UnsupportedError(f"{at}: {what} '{name}' is not known when the graph is imported: {because}")

    def fold_if(self, onode, node_name: str, at: str) -> None:
        then_b, else_b = self.body(onode, "then_branch", at), self.body(onode, "else_branch", at)
        if len(onode.input) != 1 or not onode.input[0]:
            raise ModelFormatError(f"{at}: If takes one input (the condition), not {len(onode.input)}")
        if self.known(onode.input[0]) is None and onode.input[0] in self.ctx.infos:
            values, sizes = self.deciding_inputs(onode.input[0])
            if values and not sizes:  # (a size fixed with --input-shape decides it at import instead)
                return self.select_if(onode, then_b, else_b, node_name, at)
        taken = then_b if bool(self.known_scalar(onode.input[0], at, "its condition")) else else_b
        self.decided.add(onode.input[0])
        self.inline(taken, node_name, {}, list(onode.output), at)

    def select_if(self, onode, then_b, else_b, node_name: str, at: str) -> None:
        """An If whose condition is only known at run time (a wake-word model's verifier run when
        its own score passes a threshold) becomes both branches and a ``Where`` per output: ONNX
        ops have no side effects, so computing the branch not taken changes nothing but the work.
        Branches whose outputs differ in dtype or shape cannot be selected between: a one-line
        refusal names the two outputs."""
        cond = onode.input[0]
        info = self.ctx.infos[cond]
        shape = info.shape
        if info.dtype != "bool" or any(not isinstance(d, int) for d in shape) or int(np.prod(shape)) != 1:
            raise self.undecided(at, "its condition", cond)
        then_outs = self.inline(then_b, f"{node_name}/then", {}, None, at)
        else_outs = self.inline(else_b, f"{node_name}/else", {}, None, at)
        if len(then_outs) != len(onode.output) or len(else_outs) != len(onode.output):
            raise ModelFormatError(f"{at}: its branches have {len(then_outs)} and {len(else_outs)} outputs, the "
                                   f"node {len(onode.output)}")
        flat = self.fresh(f"{node_name}/condition")
        self.emit("Reshape", [cond, self.const(f"{node_name}/scalar", np.zeros(0, np.int64))], [flat],
                  f"{node_name}/condition")
        for a, b, out in zip(then_outs, else_outs, onode.output):
            ia, ib = self.ctx.infos[a], self.ctx.infos[b]
            if ia.dtype != ib.dtype or ia.shape != ib.shape:
                raise UnsupportedError(
                    f"{at}: its condition '{cond}' is only known at run time, and its branches' outputs '{a}' "
                    f"{ia.dtype}{list(ia.shape)} and '{b}' {ib.dtype}{list(ib.shape)} differ, so npuforge "
                    f"cannot compute both and select")
            if out:
                self.emit("Where", [flat, a, b], [out], f"{node_name}/select")

    def unroll_loop(self, onode, node_name: str, at: str) -> None:
        body = self.body(onode, "body", at)
        ins = list(onode.input) + [""] * max(0, 2 - len(onode.input))
        trip_name, cond_name, carried = ins[0], ins[1], ins[2:]
        n_carried = len(carried)
        if len(body.input) != n_carried + 2 or len(body.output) < n_carried + 1:
            raise ModelFormatError(f"{at}: its body has {len(body.input)} inputs and {len(body.output)} outputs "
                                   f"for {n_carried} loop-carried values")
        trips = int(self.known_scalar(trip_name, at, "its trip count")) if trip_name else None
        cond = bool(self.known_scalar(cond_name, at, "its condition")) if cond_name else True
        self.decided.update(n for n in (trip_name, cond_name) if n)
        if trips is None and not cond_name:
            raise UnsupportedError(f"{at}: a Loop with neither a trip count nor a condition never ends")
        n_scan = len(body.output) - 1 - n_carried
        outputs = list(onode.output) + [""] * (n_carried + n_scan - len(onode.output))
        def shaped(vi, value, dtype):  # iteration number / condition as the body declares them (rank 0 or 1)
            rank = len(vi.type.tensor_type.shape.dim) if vi.type.tensor_type.HasField("shape") else 0
            return np.full((1,) * min(rank, 1), value, dtype)
        state, scans, k = list(carried), [[] for _ in range(n_scan)], 0
        while cond and (trips is None or k < trips):
            if k >= MAX_UNROLL:
                raise UnsupportedError(f"{at}: runs more than {MAX_UNROLL} iterations; npuforge unrolls a Loop "
                                       f"only up to that")
            bind = {body.input[0].name: self.const(f"{node_name}/iter{k}/i", shaped(body.input[0], k, np.int64)),
                    body.input[1].name: self.const(f"{node_name}/iter{k}/cond", shaped(body.input[1], True, bool))}
            bind.update({vi.name: v for vi, v in zip(body.input[2:], state)})
            outs = self.inline(body, f"{node_name}/iter{k}", bind, None, at)
            value = self.known(outs[0])
            if value is None or value.size != 1:
                raise self.undecided(at, f"in iteration {k}, its body's condition output", outs[0])
            cond = bool(value.reshape(-1)[0])
            self.decided.add(outs[0])
            state = outs[1:1 + n_carried]
            for s, v in zip(scans, outs[1 + n_carried:]):
                s.append(v)
            k += 1
        for k_, (src, target) in enumerate(zip(state, outputs)):
            if target:
                self.emit("Identity", [src], [target], f"{node_name}/output_{k_}")
        for j, (values, target) in enumerate(zip(scans, outputs[n_carried:])):
            if not target:
                continue
            if not values:
                raise UnsupportedError(f"{at}: runs no iteration, so its scan output '{target}' would be empty; "
                                       f"npuforge imports no empty tensors")
            axis0 = self.const(f"{node_name}/axis0", np.array([0], np.int64))
            rows = []
            for k_, v in enumerate(values):
                row = target if len(values) == 1 else self.fresh(f"{node_name}/scan{j}_{k_}")
                self.emit("Unsqueeze", [v, axis0], [row], f"{node_name}/scan{j}/unsqueeze_{k_}")
                rows.append(row)
            if len(values) > 1:
                self.emit("Concat", rows, [target], f"{node_name}/scan{j}/concat", axis=0)


def import_onnx(model, name: str | None = None, input_shapes: dict | None = None) -> Graph:
    """An ONNX file path or ModelProto -> a checked npuforge Graph.

    ``input_shapes``: {input name: dims} fixing dynamic input dimensions before the
    import (ints; a string keeps a dim symbolic, -1 or None keeps the model's dim), e.g.
    ``{"images": (1, 3, 640, 640)}``. A dim the file stores as -1 or 0 is dynamic.
    An entry whose value is a NumPy array fixes that input's value instead (``--input-value``):
    ``{"sr": np.array(16000)}`` makes input ``sr`` a constant of its own dtype and declared shape
    (the values fill it; a dynamic dim of a 1-d input takes their count), no longer a graph input,
    so that the If / Loop nodes and the shapes that depend on it fold at import.
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
    for name_ in _fix_input_shapes(graph, input_shapes or {}, where):  # --input-value: now a constant
        const = graph.values[name_]
        ctx.infos[name_] = TensorInfo(const.dtype, const.shape, const.data)
    for name_ in graph.inputs:
        ctx.infos[name_] = TensorInfo(graph.values[name_].dtype, graph.values[name_].shape)

    importer = _OnnxImporter(model, graph, ctx, where)
    for index, onode in enumerate(_sorted_nodes(g.node, set(ctx.infos), where)):
        importer.convert(onode, importer.node_name(onode, index))
    if not g.output:
        raise ModelFormatError(f"{where}: the graph has no outputs; a model must name at least one")
    for vo in g.output:
        if vo.name not in graph.values:
            raise ModelFormatError(f"{where}: graph output '{vo.name}' is not produced by any node")
        graph.outputs.append(vo.name)
    importer.prune()
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
