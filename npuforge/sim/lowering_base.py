"""What the two ONNX Runtime lowerings of the integer program share: initializers,
nodes, refusals naming the node, the walk over the graph dispatching each node by
its quantization kind, and the model around the nodes. The lowerings themselves
are :mod:`npuforge.sim.lowered` (float ops on exact integers) and
:mod:`npuforge.sim.qoperator` (ONNX Runtime's QLinear operators)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from ..errors import UnsupportedError
from ..export.onnx_export import OPSET, _nodes_of
from ..ir import dtypes
from .int_ops import max_abs_code

INTEGER_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def channel_ranges(plain, node) -> tuple[np.ndarray, ...]:
    """(a, b, lo, hi), int64 arrays [C] for a Conv / Gemm / MatMul of the plain simulator
    ``plain``: every accumulator (bias included) that channel c can reach lies in
    [a_c, b_c] (its bias plus or minus the channel's sum of |w| times the largest input
    code); its output codes, less the zero point, are clamped to [lo_c, hi_c]."""
    prep = plain._prep_compute(node)
    channels = len(prep["rows"])
    zp = int(plain._q(node.outputs[0]).zero_point)
    lo, hi = (np.broadcast_to(np.asarray(v, np.int64) - zp, (channels,)).copy() for v in prep["bounds"])
    b0 = np.zeros(channels, np.int64) if prep["bias"] is None else \
        np.broadcast_to(prep["bias"], (channels,)).astype(np.int64)
    spread = prep["rows"].astype(np.int64) * max_abs_code(plain._q(node.inputs[0]))
    return b0 - spread, b0 + spread, lo, hi


def matmul_ranges(plain, node) -> tuple[np.ndarray, ...] | None:
    """(a, b, lo, hi) as :func:`channel_ranges` gives them, for a MatMul of two activations (one
    channel): every accumulator lies in [-bound, bound], bound = K max|qa - zp_a| max|qb - zp_b|;
    None where the inner dimension K is not static."""
    g = plain.graph
    k = g.values[node.inputs[0]].shape[-1]
    if not isinstance(k, int):
        return None
    bound = k * max_abs_code(plain._q(node.inputs[0])) * max_abs_code(plain._q(node.inputs[1]))
    yq = plain._q(node.outputs[0])
    zp = int(yq.zero_point)
    return np.array([-bound]), np.array([bound]), np.array([int(yq.qmin) - zp]), np.array([int(yq.qmax) - zp])


# ops the integer program runs in float that ONNX Runtime computes exactly as the plain path
# does: elementwise, each output the float32 product ``(q - zp) * s`` compared with a constant,
# or one correctly rounded conversion (Silero VAD's sample rate cast to float), then the
# output's quantization; no summation whose order a float kernel chooses
EXACT_IN_FLOAT = ("Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Equal", "Cast")


def runs_in_float(graph, node, kind) -> bool:
    """Whether the integer program runs ``node`` in float (as the plain simulator does): kept in
    float by the quantizer (no quantization kind), or a node that only moves values applied to
    a float one."""
    return kind is None or (kind in ("passthrough", "concat") and bool(node.inputs) and
                            graph.values[node.inputs[0]].quant is None)


def pointwise_conv(weight_shape: tuple, attrs: dict) -> bool:
    """Whether a Conv is a plain 1x1 one (not grouped, stride 1, no padding): a matrix product of
    its weights and its input's pixels."""
    return tuple(weight_shape[2:]) == (1, 1) and attrs.get("group", 1) == 1 and \
        all(v == 1 for v in attrs.get("strides", [1])) and not any(attrs.get("pads", [0]))


class LoweringBuilder:
    """Subclasses set ``ELEM_TYPE`` (the ONNX type of the graph's inputs and outputs),
    ``SUFFIX`` (of the graph name), ``DOMAINS`` (extra opset domains), implement
    ``check_inputs`` and one ``_<kind>(node)`` per quantization kind they lower."""

    ELEM_TYPE: int
    SUFFIX: str
    DOMAINS: tuple = ()

    def __init__(self, plain, float_nodes: bool = False):
        self.plain = plain  # the plain IntegerSimulator: node constants, tables, the reference
        self.float_nodes = float_nodes  # lower the nodes the program runs in float (else a refusal)
        self.graph = plain.graph
        self.nodes: list = []
        self.inits: list = []
        self.report: dict[str, str] = {}  # node -> how it was lowered
        self._consts: set[str] = set()
        self._made: set[str] = set()  # values derived once per activation (their copies in another type)
        self.exact_int: dict[str, str] = {}  # a float32 copy of int32 sums, all below 2^24 -> those sums
        # exact float64 sums ``v + K`` (K a constant), multiples of 2^-t with t <= 45, floored into codes
        self.exact_sums: set[str] = set()

    def const(self, name: str, arr) -> str:
        """An initializer, made once (names derive from the value or node they belong to)."""
        if name not in self._consts:
            self._consts.add(name)
            self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def emit(self, op: str, inputs: list, output: str, domain: str = "", **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, domain=domain, **attrs))
        return output

    def lookup(self, table: str, index: str, output: str, like: str | None = None) -> str:
        """``output = table[index]`` for a 1-D constant ``table`` and integer indices of any shape:
        ``GatherElements`` on the flattened indices, 4.5x faster in ONNX Runtime than ``Gather``,
        which copies element by element (uint8 table, [1, 101, 768] indices, one thread: 87
        against 393 us). ``like``: an IR value of the indices' shape, where ``output`` is none."""
        flat = self.emit("Reshape", [index, self.const("lookup_flat", np.array([-1], np.int64))], f"{output}::flat_ix")
        found = self.emit("GatherElements", [table, flat], f"{output}::flat", axis=0)
        v = self.graph.values.get(like or output)  # an IR value, static but for its batch axis: its shape a constant
        if v is not None and len(v.shape) >= 1 and all(isinstance(d, int) for d in v.shape[1:]):
            shape = self.const(f"{output}::shape", np.array([-1, *v.shape[1:]], np.int64))
        else:
            shape = self.emit("Shape", [index], f"{output}::shape")
        return self.emit("Reshape", [found, shape], output)

    def float_op(self, node, renames: dict, quantized) -> None:
        """The op of a node the program runs in float, its ONNX nodes reading ``renames`` (value ->
        its float copy) and writing ``y::float`` for each value ``y`` of ``quantized``, which the
        caller then quantizes into ``y``. Node names follow: an op node named after its output
        (a multi-node form's last one) would otherwise share its name with that quantizer."""
        for emitted in _nodes_of(self.graph, node):
            emitted.input[:] = [renames.get(n, n) for n in emitted.input]
            emitted.output[:] = [f"{n}::float" if n in quantized else n for n in emitted.output]
            if emitted.name in quantized:
                emitted.name = f"{emitted.name}::float"
            self.nodes.append(emitted)

    def refuse(self, node, why: str):
        where = f"node '{node.name}' ({node.op})" if node is not None else "the graph"
        raise UnsupportedError(f"{where}: {why}, so it has no ONNX Runtime lowering")

    def check_inputs(self) -> None:
        raise NotImplementedError

    def lower(self, node, handler) -> None:
        """Lower one node with the handler of its kind (a subclass may route it elsewhere)."""
        handler(node)

    def is_index(self, name: str) -> bool:
        """An unquantized integer or bool value (token ids, positions, shapes, a condition): ONNX
        Runtime computes it exactly as the plain path does, with the op itself."""
        v = self.graph.values[name]
        return v.quant is None and (v.dtype in INTEGER_DTYPES or v.dtype == "bool")

    def elem_type(self, name: str) -> int:
        """The ONNX type of a graph input or output: its own where it is not quantized."""
        v = self.graph.values[name]
        return dtypes.to_onnx(v.dtype) if v.quant is None else self.ELEM_TYPE

    def _build_node(self, node) -> None:
        """Lower one node by its kind (UnsupportedError where there is no lowering)."""
        g = self.graph
        kind = self.plain._kind(node)
        in_float = runs_in_float(g, node, kind)
        if in_float:
            handler = getattr(self, "_float_node", None) if self.float_nodes or node.op in EXACT_IN_FLOAT else None
        else:
            handler = getattr(self, f"_{kind}", None)
        if (in_float or handler is None) and all(self.is_index(n) for n in (*node.inputs, *node.outputs) if n):
            for name in node.inputs:
                if name and g.values[name].is_const:
                    self.const(name, np.asarray(g.values[name].data))
            self.nodes.extend(_nodes_of(g, node))
            self.report[node.name] = "integer index arithmetic"
            return
        if handler is None:
            self.refuse(node, "it runs in float" if in_float else f"no lowering for a '{kind}' node")
        self.lower(node, handler)
        self.report.setdefault(node.name, kind)

    def finish(self) -> None:
        """A last pass over the emitted nodes, before the dead ones go (a subclass may rewrite them)."""

    def build(self):
        g = self.graph
        self.check_inputs()
        for index, node in enumerate(g.nodes):
            try:
                self._build_node(node)
            except UnsupportedError as e:
                e.node_index = getattr(e, "node_index", index)  # where a split simulator's plain part starts
                raise
        self.finish()
        info = [helper.make_tensor_value_info(n, self.elem_type(n), list(g.values[n].shape))
                for n in (*g.inputs, *g.outputs)]
        nodes = _live(self.nodes, set(g.outputs))
        used = {name for n in nodes for name in n.input}
        graph = helper.make_graph(nodes, f"{g.name}-{self.SUFFIX}", info[:len(g.inputs)], info[len(g.inputs):],
                                  [t for t in self.inits if t.name in used])
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in self.DOMAINS]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="npuforge")
        model.ir_version = 10
        return model


def _live(nodes: list, outputs: set) -> list:
    """The nodes some graph output depends on, in order. A node the float lowering runs leaves its
    output's codes behind even where every consumer reads the float copy; ONNX Runtime would run
    those conversions all the same (deit_tiny: 8 of 2,371 nodes, each 5-8 us at batch 1)."""
    needed, live = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(node.input)
    return live[::-1]
