"""Lowering: a quantized IR becomes a list of NPU operations on HWC tensors.

Every activation is stored channel-last (``[H, W, C]``, batch 1) as NPU SRAM holds it, so
a row of a tensor is ``W * C`` contiguous codes and a stripe of rows is one block. A
2-D value ``[1, K]`` is a ``1 x 1 x K`` tensor, so Flatten after a global pool moves no
byte (an alias). Each operation carries its parameter block: the integers the quantizer
stored on the node (weights, biases, multipliers, shifts, tables) and the few the graph
simulator derives from them (activation bounds, the extra fractional bits of Add and
pooling, the divisor of every pooling window), decided here once so that the program
needs nothing but its own bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..ir.infer import input_infos
from ..ops.registry import TensorInfo, get_op
from ..quant.as_2d import as_2d
from ..quant.requant import activation_code_bounds, extra_bits, multiplier_value, quantize_multiplier
from ..sim.int_ops import max_abs_code
from .binfmt import DTYPE_BYTES, MAX_INPUTS, QRANGE
from .cpu import encode_node, value_dims, value_layout

# ops that only rename a value whose HWC bytes stay in the same order
_VIEWS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Dropout")
# the NPU class of a node command for each IR op (npuforge/compiler/target.py NPU_OPS); an op not here,
# or a node kept in float, runs on the host CPU
NODE_CLASS = {**dict.fromkeys(("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "DepthToSpace",
                               "SpaceToDepth", "Identity", "Dropout", "Expand", "Tile"), "transpose"),
              **dict.fromkeys(("MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose"), "matmul"),
              **dict.fromkeys(("Softmax", "LogSoftmax"), "softmax"),
              **dict.fromkeys(("LayerNormalization", "InstanceNormalization", "GroupNormalization",
                               "LpNormalization", "L2Normalize", "MeanVarianceNormalization"), "normalization"),
              **dict.fromkeys(("Gather", "GatherElements", "GatherND"), "gather"),
              **dict.fromkeys(("Slice", "Split", "Concat"), "slice"),
              "Pad": "pad",
              **dict.fromkeys(("Add", "Sub", "Mul", "Div", "PRelu", "LeakyRelu", "Max", "Min", "Clip", "Sum",
                               "Mean", "Resize"), "elementwise"),
              **dict.fromkeys(("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "GlobalAveragePool",
                               "GlobalMaxPool", "ArgMax", "ArgMin", "TopK", "MaxPool", "AveragePool"), "reduce")}


@dataclass
class Tensor:
    """An activation: its geometry, its codes' type and grid, and (after planning) its place."""
    name: str
    dtype: str
    h: int
    w: int
    c: int
    scale: float
    zero_point: int
    nchw: tuple = ()  # the IR shape (batch 1), for the program's input / output descriptors
    dram: bool = False  # spilled: lives in DRAM, read and written at DRAM's rate (compile.py decides)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def row_bytes(self) -> int:
        return self.w * self.c * self.itemsize

    @property
    def nbytes(self) -> int:
        return self.h * self.row_bytes


@dataclass
class NpuOp:
    """One NPU operation: ``kind`` of :data:`~npuforge.compiler.target.NPU_OPS`, tensor ids in and
    out, ``params`` (name -> int or integer array; the parameter block) and packed ``weights``."""
    name: str
    kind: str
    inputs: list
    output: int
    params: dict = field(default_factory=dict)
    weights: np.ndarray | None = None
    macs: int = 0
    why: str = ""  # a node command: why the node has no NPU kernel (or, on the CPU, no NPU class)
    ir_op: str = ""  # the IR op it computes

    # window geometry (conv, depthwise, pools); identity for the others
    def window(self) -> tuple:
        p = self.params
        return int(p.get("kernel_h", 1)), int(p.get("stride_h", 1)), int(p.get("dilation_h", 1)), \
            int(p.get("pad_top", 0))


@dataclass
class Lowered:
    tensors: list
    ops: list
    inputs: list  # tensor ids of the graph inputs, in order
    outputs: list
    names: dict  # IR value name -> tensor id (aliases share one)


def _static(shape, where: str) -> tuple:
    dims = []
    for k, d in enumerate(shape):
        if isinstance(d, str):
            if k != 0:
                raise UnsupportedError(f"{where}: dynamic dimension '{d}' at axis {k}; fix the input sizes "
                                       f"(--input-shape) before compiling")
            d = 1
        dims.append(int(d))
    if len(dims) >= 3 and dims[0] != 1:  # (a 2-D value's first dim counts rows: tokens [L, D])
        raise UnsupportedError(f"{where}: batch {dims[0]}; an NPU program runs one sample (batch 1)")
    return tuple(dims)


class _Lowering:
    def __init__(self, graph, target):
        self.g = graph
        self.target = target
        self.tensors: list[Tensor] = []
        self.ops: list[NpuOp] = []
        self.ids: dict[str, int] = {}
        # every value's shape (and constants' data), for the node commands' MACs
        self.infos = {n: TensorInfo(v.dtype, tuple(v.shape or ()), v.data) for n, v in graph.values.items()}

    # -- values ---------------------------------------------------------------------------------
    def tensor(self, name: str, where: str, npu: bool = True, ranks=(2, 3, 4)) -> int:
        """The program tensor of IR value ``name`` (created on first use, laid out as cpu.value_layout
        says). ``npu``: the value feeds or comes from an NPU kernel, which takes one-scale codes of a
        tensor of one of ``ranks`` (None: any) with batch 1; anything else is an UnsupportedError, and
        the node becomes a node command (run whole by the integer simulator's kernel)."""
        v = self.g.values[name]
        if name not in self.ids:
            try:
                dtype, h, w, c = value_layout(v)
            except ModelFormatError as e:
                raise UnsupportedError(f"{where}: {e}") from None
            p = v.quant
            scale = float(p.scale) if p is not None and not p.per_channel else 1.0
            zp = int(p.zero_point) if p is not None and not p.per_channel else 0
            self.tensors.append(Tensor(name, dtype, h, w, c, scale, zp, value_dims(v)))
            self.ids[name] = len(self.tensors) - 1
        if npu:
            p = v.quant
            if p is None:
                raise UnsupportedError(f"{where}: value '{name}' is not quantized; the NPU computes codes")
            if p.dtype not in QRANGE:  # the code dtypes
                raise UnsupportedError(f"{where}: value '{name}' is {p.dtype}; the NPU stores int8, uint8 or int16")
            if p.per_channel:
                raise UnsupportedError(f"{where}: value '{name}' is quantized per channel; NPU activations have "
                                       f"one scale and zero point")
            shape = _static(v.shape, where)
            if ranks is not None and len(shape) not in ranks:
                raise UnsupportedError(f"{where}: value '{name}' has rank {len(shape)}; this NPU kernel takes "
                                       f"rank {' or '.join(map(str, ranks))}")
        return self.ids[name]

    def _int(self, node, role) -> np.ndarray:
        value = self.g.values.get(node.quant.get(role, ""))
        if value is None or not value.is_const:  # a hand-edited or damaged quantized file
            raise ModelFormatError(f"node '{node.name}' ({node.op}): its quantization integer '{role}' is missing; "
                                   f"quantize the model again")
        return np.asarray(value.data)

    def _add(self, node, kind, inputs, params, weights=None, macs=0, ranks=(2, 3, 4)) -> None:
        if kind not in self.target.native_ops:
            raise UnsupportedError(f"node '{node.name}' ({node.op}): target '{self.target.name}' has no "
                                   f"'{kind}' operation (its native ops: {', '.join(self.target.native_ops)})")
        where = f"node '{node.name}' ({node.op})"
        ins = [self.tensor(i, where, ranks=ranks) for i in inputs]
        out = self.tensor(node.outputs[0], where, ranks=ranks)
        self.ops.append(NpuOp(node.name, kind, ins, out, params, weights, macs, ir_op=node.op))

    # -- the walk ---------------------------------------------------------------------------------
    def run(self) -> Lowered:
        g = self.g
        for name in g.inputs:
            where = f"graph input '{name}'"
            dims = value_dims(g.values[name])
            if len(dims) >= 2 and dims[0] != 1:
                raise UnsupportedError(f"{where}: batch {dims[0]}; an NPU program runs one sample (batch 1)")
            self.tensor(name, where, npu=False)
        for node in g.nodes:
            try:
                self._kernel(node)
            except UnsupportedError as e:  # no NPU kernel: the node runs whole, by its integer rule
                self._node(node, str(e))
        for name in g.outputs:
            if name not in self.ids:
                raise UnsupportedError(f"graph output '{name}' is not computed by the NPU program")
        return Lowered(self.tensors, self.ops, [self.ids[n] for n in g.inputs], [self.ids[n] for n in g.outputs],
                       dict(self.ids))

    def _node(self, node, why: str) -> None:
        """A node command per output: the node's NPU class where the target runs it and the node
        computes integers, else the host CPU; ``why`` is kept for the report."""
        where = f"node '{node.name}' ({node.op})"
        g = self.g
        why = why.removeprefix(f"{where}: ")
        klass = NODE_CLASS.get(node.op)
        integer = self._integer(node) and all(g.values[o].quant is not None for o in node.outputs if o)
        kind = klass if klass in self.target.native_ops and integer else "cpu"
        if kind == "cpu" and klass is not None and integer:
            why = f"{why}; target '{self.target.name}' does not list '{klass}'"
        blob = encode_node(g, node)
        seen, ins = set(), []
        for name in node.inputs:  # as cpu.node_graph orders the node's inputs
            if name and name not in seen and not g.values[name].is_const:
                seen.add(name)
                ins.append(self.tensor(name, where, npu=False))
        outs = [o for o in node.outputs if o]
        try:
            macs = int(get_op(node.op).macs(node, input_infos(node, self.infos), [self.infos.get(o) for o in
                                                                                   node.outputs]))
        except (TypeError, ValueError, AttributeError):  # a shape rule that needs what infos lack
            macs = 0
        for k, name in enumerate(outs):
            label = node.name if len(outs) == 1 else f"{node.name}:{name}"
            self.ops.append(NpuOp(label, kind, ins, self.tensor(name, where, npu=False),
                                  {"node": blob, "output_index": k}, None, macs if k == 0 else 0, why, node.op))

    def _integer(self, node) -> bool:
        """Whether the quantizer gave the node an integer program: integers of its own, or a rule that
        moves codes (as the integer simulator decides)."""
        return bool(node.quant) or get_op(node.op).quant_kind(node, self.g) in ("passthrough", "concat")

    def _kernel(self, node) -> None:
        """The node as NPU kernel operations; UnsupportedError when it has none on this target."""
        g = self.g
        where = f"node '{node.name}' ({node.op})"
        kind = get_op(node.op).quant_kind(node, g)
        out = g.values[node.outputs[0]] if node.outputs and node.outputs[0] else None
        if out is None or out.quant is None or not self._integer(node):
            raise UnsupportedError(f"{where}: kept in float by the quantizer")
        for name in node.inputs:  # (a float input of a code-moving node: the integer simulator quantizes it)
            if name and g.values[name].quant is None and not g.values[name].is_const:
                raise UnsupportedError(f"{where}: input '{name}' is float; the NPU computes codes")
        if node.op in _VIEWS:
            self._view(node, where)
        elif kind == "compute":
            self._compute(node, where)
        elif kind == "elementwise":
            self._elementwise(node, where)
        elif kind == "pool":
            self._pool(node, where)
        elif kind == "lut":
            self._lut(node)
        elif kind == "concat":
            self._concat(node, where)
        elif node.op == "MaxPool":
            self._window(node, "maxpool", where, {})
        elif kind == "interpolate":
            self._resize(node, where)
        else:
            raise UnsupportedError(f"{where}: no NPU kernel for {node.op}")

    # -- kinds ------------------------------------------------------------------------------------------
    def _view(self, node, where):
        """A reshape that leaves the bytes where they are is the same tensor under another name."""
        src = self.tensor(node.inputs[0], where)
        t = self.tensors[src]
        v = self.g.values[node.outputs[0]]
        try:
            _, h, w, c = value_layout(v)
        except ModelFormatError as e:
            raise UnsupportedError(f"{where}: {e}") from None
        ranks = (len(t.nchw), len(value_dims(v)))
        same_order = h * w == 1 or c == 1 or ranks[0] == ranks[1] or max(ranks) <= 3  # both in the IR's order
        if (t.h, t.w, t.c) != (h, w, c) or not same_order:
            # the same bytes under another record (a flat [1, L, 1] to [1, L]) would still be a copy: every
            # consumer, NPU kernel or node command, reads its input under its own value's record; and a
            # 3-D [1, L, D] (tokens, IR order) and a 4-D [1, D, 1, L] (channel-last) share a record, not an order
            raise UnsupportedError(f"{where}: reshaping {t.h} x {t.w} x {t.c} (H x W x C) to {list(v.shape)} "
                                   f"({h} x {w} x {c}) changes the tensor's record")
        p = v.quant
        if p is None or not (p.dtype == t.dtype and float(p.scale) == t.scale and int(p.zero_point) == t.zero_point):
            raise UnsupportedError(f"{where}: output parameters differ from the input's; a view cannot rescale")
        if node.outputs[0] in self.g.outputs:  # the program names its outputs as the graph does
            if t.name in self.g.outputs or t.name in self.g.inputs:
                raise UnsupportedError(f"{where}: its input is a graph input or output too; a copy keeps both names")
            t.name, t.nchw = node.outputs[0], value_dims(v)
        self.ids[node.outputs[0]] = src

    def _bounds(self, node, p) -> tuple:
        if "act_min" in node.quant:
            lo, hi = (self._int(node, r).astype(np.int64) for r in ("act_min", "act_max"))
        else:
            lo, hi = (np.asarray(b, np.int64) for b in activation_code_bounds(node, p))
        return lo, hi

    def _compute(self, node, where):
        g, a = self.g, node.attrs
        xq, yq = g.values[node.inputs[0]].quant, g.values[node.outputs[0]].quant
        w = self._int(node, "weight").astype(np.int64)
        if node.op == "Conv" and w.ndim == 4:
            cout, cin_g, kh, kw = w.shape
            group = a["group"]
            cin = cin_g * group
            depthwise = group == cin and cout == cin
            kind = "depthwise" if depthwise else "conv"
            # OHWI (output channel, kernel row, kernel column, input channel): the order the MAC
            # array reads them; depthwise: HWC
            packed = w.transpose(2, 3, 0, 1).reshape(kh, kw, cout) if depthwise else w.transpose(0, 2, 3, 1)
            pads = a["pads"]
            params = {"kernel_h": kh, "kernel_w": kw, "stride_h": a["strides"][0], "stride_w": a["strides"][1],
                      "dilation_h": a["dilations"][0], "dilation_w": a["dilations"][1], "pad_top": pads[0],
                      "pad_left": pads[1], "group": group}
            out_shape = _static(g.values[node.outputs[0]].shape, where)
            macs = int(np.prod(out_shape[1:])) * cin_g * kh * kw
        elif node.op in ("Gemm", "MatMul") and w.ndim == 2:
            transposed = node.op == "Gemm" and a["transB"]
            packed = w if transposed else w.T  # [N, K]: one row of weights per output
            kind, params = "fully_connected", {}
            in_shape = _static(g.values[node.inputs[0]].shape, where)
            rows = in_shape[-2] if len(in_shape) == 3 or (len(in_shape) == 2 and in_shape[0] > 1) else 1
            if rows > 1 or len(in_shape) == 3:  # tokens [1, L, K] or [L, K], stored 1 x L x K: a 1 x 1 convolution
                kind, packed = "conv", packed.reshape(packed.shape[0], 1, 1, packed.shape[1])
                params = {"kernel_h": 1, "kernel_w": 1, "stride_h": 1, "stride_w": 1, "dilation_h": 1,
                          "dilation_w": 1, "pad_top": 0, "pad_left": 0, "group": 1}
            elif len(in_shape) != 2:
                raise UnsupportedError(f"{where}: a fully connected layer on a rank-{len(in_shape)} input; the NPU "
                                       f"takes [1, K] and tokens [1, L, K] or [L, K]")
            macs = packed.size * rows
        else:
            raise UnsupportedError(f"{where}: {node.op} has no NPU operation (conv, depthwise and fully "
                                   f"connected are lowered)")
        if packed.size and (packed.min() < -128 or packed.max() > 127):
            raise UnsupportedError(f"{where}: weights beyond int8; the NPU's MAC array takes int8 weights")
        nout = packed.shape[0] if kind != "depthwise" else packed.shape[2]
        bias = self._int(node, "bias").astype(np.int64) if "bias" in node.quant else np.zeros(nout, np.int64)
        mult = np.broadcast_to(self._int(node, "multiplier").astype(np.int64), (nout,))
        shift = np.broadcast_to(self._int(node, "shift").astype(np.int64), (nout,))
        lo, hi = self._bounds(node, yq)
        params.update(zp_in=int(xq.zero_point), zp_out=int(yq.zero_point), bias=bias, multiplier=mult,
                      shift=shift, act_min=np.broadcast_to(lo, (nout,)), act_max=np.broadcast_to(hi, (nout,)),
                      single_rounding=int("single_rounding" in node.quant))
        if a.get("activation") == "LeakyRelu":
            mn, sn = quantize_multiplier(a["activation_params"][0] * multiplier_value(mult, shift))
            params.update(multiplier_neg=mn.astype(np.int64), shift_neg=sn.astype(np.int64))
        self._add(node, kind, node.inputs[:1], params, packed.astype(np.int8), macs)

    def _elementwise(self, node, where):
        g = self.g
        qs = [g.values[i].quant for i in node.inputs[:2]]
        yq = g.values[node.outputs[0]].quant
        for k in range(2):
            if f"input{k}" in node.quant or g.values[node.inputs[k]].is_const:
                raise UnsupportedError(f"{where}: a constant operand; the NPU's {node.op.lower()} takes two "
                                       f"activations")
        ranks = {len(g.values[i].shape) for i in [*node.inputs[:2], node.outputs[0]]}
        if len(ranks) != 1:  # ONNX aligns trailing dims; the stored layouts align channels
            raise UnsupportedError(f"{where}: operands of ranks {sorted(ranks)}; the NPU's {node.op.lower()} "
                                   f"takes operands of the output's rank")
        shapes = [self.tensors[self.tensor(i, where)] for i in node.inputs[:2]]
        out = self.tensors[self.tensor(node.outputs[0], where)]
        for t in shapes:
            if any(d not in (1, o) for d, o in zip((t.h, t.w, t.c), (out.h, out.w, out.c))):
                raise UnsupportedError(f"{where}: operand '{t.name}' does not broadcast to the output")
        params = {"zp_in0": int(qs[0].zero_point), "zp_in1": int(qs[1].zero_point), "zp_out": int(yq.zero_point)}
        kind = node.op.lower()
        if node.op == "Mul":
            params.update(multiplier=int(self._int(node, "multiplier")[0]), shift=int(self._int(node, "shift")[0]))
        elif "multiplierout" in node.quant:  # TFLite's ADD: three multipliers
            params.update(mode=1, left_shift=int(self._int(node, "left_shift")),
                          multiplier_out=int(self._int(node, "multiplierout")[0]),
                          shift_out=int(self._int(node, "shiftout")[0]))
        else:
            shifts = [int(self._int(node, f"shift{k}")[0]) for k in range(2)]
            params.update(mode=0, left_shift=min(extra_bits(max_abs_code(qs[k]), shifts[k]) for k in range(2)))
        if node.op != "Mul":
            for k in range(2):
                params[f"multiplier{k}"] = int(self._int(node, f"multiplier{k}")[0])
                params[f"shift{k}"] = int(self._int(node, f"shift{k}")[0])
        self._add(node, kind, node.inputs[:2], params, macs=0)

    def _window(self, node, kind, where, params):
        a = node.attrs
        if len(a["kernel_shape"]) != 2:
            raise UnsupportedError(f"{where}: {len(a['kernel_shape'])}-D pooling; the NPU pools 2-D windows")
        shape = _static(self.g.values[node.inputs[0]].shape, where)
        pads = get_op(node.op).exact_pads(node, shape)
        params.update(kernel_h=a["kernel_shape"][0], kernel_w=a["kernel_shape"][1], stride_h=a["strides"][0],
                      stride_w=a["strides"][1], dilation_h=a["dilations"][0], dilation_w=a["dilations"][1],
                      pad_top=pads[0], pad_left=pads[1])
        self._add(node, kind, node.inputs[:1], params)

    def _pool(self, node, where):
        import torch

        g = self.g
        xq, yq = g.values[node.inputs[0]].quant, g.values[node.outputs[0]].quant
        in_shape = _static(g.values[node.inputs[0]].shape, where)
        params = {"zp_in": int(xq.zero_point), "zp_out": int(yq.zero_point)}
        if node.op == "AveragePool":
            ones = torch.ones((1, 1, *in_shape[2:]), dtype=torch.float64)
            counts = get_op("AveragePool").window_sums(node, ones)[1].numpy().astype(np.int64)[0, 0]
            kind = "avgpool"
        elif node.op == "GlobalAveragePool" or node.op in ("ReduceMean", "ReduceSum") and self._spatial(node):
            if len(in_shape) != 4:
                raise UnsupportedError(f"{where}: a global pool of a rank-{len(in_shape)} value")
            counts = np.full((1, 1), in_shape[2] * in_shape[3], np.int64)
            kind = "global_avgpool"
        else:
            raise UnsupportedError(f"{where}: {node.op} over other axes than H and W has no NPU operation")
        if "sum_scale" in node.quant:  # LiteRT's SUM computes in float: no NPU pooling computes it
            raise UnsupportedError(f"{where}: LiteRT's float32 SUM arithmetic has no NPU operation")
        if "code_average" in node.quant:
            params.update(code_average=1)
        else:
            m, s = int(self._int(node, "multiplier")[0]), int(self._int(node, "shift")[0])
            bits = int(self._int(node, "extra_bits")) if "extra_bits" in node.quant else \
                extra_bits(int(counts.max()) * max_abs_code(xq), s)
            if "divisor" in node.quant:
                divisor = np.full_like(counts, int(self._int(node, "divisor")))
            else:
                divisor = np.ones_like(counts) if node.op == "ReduceSum" else counts
            params.update(multiplier=m, shift=s, extra_bits=bits, divisor=divisor.reshape(-1))
        params["count"] = counts.reshape(-1)
        if kind == "avgpool":
            self._window(node, kind, where, params)
        else:
            self._add(node, kind, node.inputs[:1], params)

    def _spatial(self, node) -> bool:
        axes_name = node.inputs[1] if len(node.inputs) > 1 else ""
        if not axes_name:
            return False
        axes = sorted(int(v) % 4 for v in np.asarray(self.g.values[axes_name].data).reshape(-1))
        return axes == [2, 3]

    def _lut(self, node):
        xq = self.g.values[node.inputs[0]].quant
        table = self._int(node, "lut").astype(np.int64)
        self._add(node, "lut", node.inputs[:1], {"qmin": xq.qmin, "table": table}, ranks=None)  # any layout

    def _concat(self, node, where):
        g = self.g
        yq = g.values[node.outputs[0]].quant
        rank = len(g.values[node.outputs[0]].shape)
        if node.attrs["axis"] % rank != (2 if rank == 3 else 1):  # the axis stored innermost (C, or D of tokens)
            raise UnsupportedError(f"{where}: concatenation along axis {node.attrs['axis']}; the NPU "
                                   f"concatenates channels")
        if len(node.inputs) > MAX_INPUTS:
            raise UnsupportedError(f"{where}: {len(node.inputs)} inputs; an NPU concat takes at most {MAX_INPUTS}")
        for name in node.inputs:
            if not g.values[name].quant.same_as(yq):
                raise UnsupportedError(f"{where}: input '{name}' does not share the output's parameters")
        self._add(node, "concat", node.inputs, {})

    def _resize(self, node, where):
        from ..quant.resize_rule import axis_weights

        g = self.g
        yq = g.values[node.outputs[0]].quant
        ins = _static(g.values[node.inputs[0]].shape, where)
        out = _static(g.values[node.outputs[0]].shape, where)
        align, half = bool(self._int(node, "align_corners")), bool(self._int(node, "half_pixel_centers"))
        ylo, yhi, wy0, wy1 = axis_weights(ins[2], out[2], align, half)
        xlo, xhi, wx0, wx1 = axis_weights(ins[3], out[3], align, half)
        self._add(node, "resize_bilinear", node.inputs[:1],
                  {"code_shift": 128 if yq.dtype == "uint8" else 0, "row_lo": ylo, "row_hi": yhi, "row_w0": wy0,
                   "row_w1": wy1, "col_lo": xlo, "col_hi": xhi, "col_w0": wx0, "col_w1": wx1})


def lower(graph, target) -> Lowered:
    """The NPU operations of a quantized graph (one-line errors name the node that cannot be lowered)."""
    if not any(v.quant is not None for v in graph.values.values()):
        raise UnsupportedError(f"graph '{graph.name}' is not quantized; quantize it first (npuforge quantize)")
    return _Lowering(as_2d(graph), target).run()  # 1-D convolutions and pools as the 2-D kernels (H = 1)
