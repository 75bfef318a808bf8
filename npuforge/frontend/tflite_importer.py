"""TFLite flatbuffers (``.tflite``) -> npuforge IR: float models, and fully int8 models
(TFLite's quantization spec) as a quantized IR the integer simulator runs as it is.

Layout. TFLite is NHWC, the IR NCHW: every 4-D tensor is permuted (N,H,W,C)->(N,C,H,W)
at import, graph inputs and outputs included -- feed the IR LiteRT's NHWC arrays
transposed by (0, 3, 1, 2), and a 4-D IR output is LiteRT's transposed the same way.
Conv weights OHWI become OIHW, depthwise [1, KH, KW, C*M] becomes [C*M, 1, KH, KW]
with group C, the axes of CONCATENATION / MEAN / PAD / SOFTMAX / TRANSPOSE are
remapped, and a RESHAPE from or to a 4-D tensor gets Transposes around it where the
NHWC and NCHW element orders differ (they agree when C == 1 or H * W == 1). TF's SAME
padding becomes explicit pads, fused activations become Relu / Clip nodes (the
optimizer fuses them again), float16 weights behind DEQUANTIZE float32 constants.
Sparse constants (TFLite's sparsity parameters) are densified as they are read, so a
DENSIFY of one folds away; STRIDED_SLICE becomes a Slice on the IR's axes (tflite_ops.py);
MediaPipe's custom op Convolution2DTransposeBias becomes a ConvTranspose (tflite_custom.py).

Int8 models. The float IR is the dequantized model (weights = scale * codes); every
activation keeps the file's scale and zero point (``Value.quant``), and each node
gets the integers the quantizer stores with ``tflite_multipliers=True``: Conv / Gemm
weight and bias codes from the file, multipliers derived from the scales as LiteRT
derives them (:mod:`npuforge.quant.requant`), fused activation bounds as TFLite
computes them (a Conv / Gemm carries its activation fused). A QUANTIZE after a float
graph input and a DEQUANTIZE before a float graph output are dropped: the IR input /
output is the int8 side, float with that side's parameters. Every other node gets the
quantizer's rule for its kind (``quant_kind``) under ``tflite_multipliers``: TFLite's
arithmetic where npuforge has it (ADD / SUB / MUL, MEAN, AVERAGE_POOL_2D, RELU's and
HARD_SWISH's kernels as tables, SOFTMAX, RESIZE_BILINEAR), LOGISTIC / TANH tables of
the float op rounded to the output grid (quant/tflite_tables.py says how each
compares with LiteRT). An op whose output keeps its input's parameters in npuforge
(MAX_POOL_2D, RESHAPE, TRANSPOSE, PAD, CONCATENATION, RESIZE_*) must have them in the
file too; an op with no integer rule is refused, naming it.

Corrupt files. The flatbuffer accessors of the ``tflite`` package check no offset, so
:mod:`npuforge.frontend.tflite_verify` first checks every table, vector, index and shape
the importer reads; the rules check attribute values (strides, padding, activation,
axes) before computing with them. A bad file is a ModelFormatError naming the file and
the tensor or operator.
"""

from __future__ import annotations

import copy
import os
import struct
import traceback
from pathlib import Path

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator
from tflite.Padding import Padding

from ..errors import ModelFormatError, NpuforgeError, UnsupportedError
from ..ir.graph import Graph, Node, Value
from ..ir.infer import infer_node, input_infos
from ..ops.registry import TensorInfo, get_op
from ..passes.rewrite import rename_value
from ..quant.config import QuantConfig
from ..quant.params import QParams
from ..quant.quantize import _quantize_node
from ..sim.lowering_base import runs_in_float
from .tflite_custom import CustomRules
from .tflite_ops import IR_AXIS, TFLITE_CONFIG, TO_FILE, TO_IR, OperatorRules, ir_shape, orders_differ
from .tflite_recurrent import RecurrentRules
from .tflite_shapes import ShapeRules
from .tflite_verify import read_sparsity, verify_model, verify_options

_OP_NAMES = {code: name for name, code in vars(BuiltinOperator).items() if not name.startswith("_")}
# quantization kinds whose output keeps its input's parameters (npuforge moves or interpolates codes)
_SHARED_GRID = ("passthrough", "concat", "interpolate")
_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8"}


def _text(raw: bytes) -> str:
    """A name from the file, control characters escaped: a corrupt name must not break an error
    message's one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw.decode("utf-8", "replace"))


def is_tflite(head: bytes) -> bool:
    """A TFLite flatbuffer names its file identifier at bytes 4..8."""
    return head[4:8] == b"TFL3"


class _NoOptions:
    """The options of an operator written without its table: every field reads 0 (no fused
    activation, VALID padding, ...), as the schema's defaults mostly are."""

    def __getattr__(self, name):
        return lambda: 0


class _Importer(OperatorRules, ShapeRules, RecurrentRules, CustomRules):
    def __init__(self, buf: bytes, where: str, name: str):
        self.buf, self.where = buf, where
        verify_model(buf, where)  # the generated accessors below check no offset themselves
        self.model = tflite.Model.GetRootAsModel(buf, 0)
        self.sg = self.model.Subgraphs(0)
        if self.sg.OperatorsLength() == 0:
            raise ModelFormatError(f"{where}: the TFLite model has no operators; the file may be truncated")
        self.graph = Graph(name)
        self.infos: dict[str, TensorInfo] = {}
        self.names: dict[int, str] = {}  # tensor index -> IR value (in IR layout)
        self.folded: dict[int, np.ndarray] = {}  # DEQUANTIZE of a constant: float32 data, file layout
        self.resolved: dict[int, tuple] = {}  # dynamic tensors' shapes as the import computed them
        self.transposed: dict[str, tuple] = {}  # a Transpose's output -> (its input, perm)
        self.origin: dict[str, str] = {}  # node -> "operator i (OP)", for errors
        self.at = ""
        self.skip: set[int] = set()  # operators dropped at the graph boundary
        # int8 activations with parameters: an int8 model (a float one has none)
        self.int8_model = any(self.tensor(i).Type() == 9 and self.qparams(i) is not None and not self.has_data(i)
                              for i in range(self.sg.TensorsLength()))
        # the operator being imported computes on int8 codes (False in a float model, and for the float
        # operators an int8 model runs between a DEQUANTIZE and a QUANTIZE)
        self.quantized = self.int8_model
        self.float_islands: list[str] = []  # nodes of an int8 model that the file computes in float

    # -- the file's tensors ----------------------------------------------------------
    def tensor(self, i: int):
        return self.sg.Tensors(i)

    def tname(self, i: int) -> str:
        raw = self.tensor(i).Name()
        return _text(raw) if raw else f"tensor_{i}"

    def dtype(self, i: int) -> str:
        code = self.tensor(i).Type()
        if code not in _DTYPES:
            raise UnsupportedError(f"{self.where}: tensor {i} ('{self.tname(i)}') has TFLite type {code}, "
                                   f"which npuforge does not import")
        return _DTYPES[code]

    def file_shape(self, i: int) -> tuple:
        if i in self.resolved:
            return self.resolved[i]
        t = self.tensor(i)
        return tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()

    def resolve_shape(self, i: int, shape: tuple) -> None:
        """A tensor the file marks dynamic (-1 in its shape signature) whose shape the import computed:
        the file's own shape is a placeholder (TensorFlow's converter writes [1, 1] for a reshape its
        shape arithmetic sizes) that LiteRT replaces when it allocates; a static tensor keeps its own."""
        t = self.tensor(i)
        signature = t.ShapeSignatureAsNumpy() if t.ShapeSignatureLength() else ()
        if tuple(shape) != self.file_shape(i) and any(int(d) < 0 for d in signature):
            self.resolved[i] = tuple(int(d) for d in shape)

    def has_data(self, i: int) -> bool:
        b = self.model.Buffers(self.tensor(i).Buffer())
        return i in self.folded or (b is not None and (b.Offset() > 1 or b.DataLength() > 0))

    def data(self, i: int) -> np.ndarray | None:
        """A constant tensor's data in the file's layout (None for an activation)."""
        if i in self.folded:
            return self.folded[i]
        if not self.has_data(i):
            return None
        t = self.tensor(i)
        b = self.model.Buffers(t.Buffer())
        # models over 2 GB keep buffers after the flatbuffer, at an offset
        raw = self.buf[b.Offset():b.Offset() + b.Size()] if b.Offset() > 1 else b.DataAsNumpy().tobytes()
        dtype, shape = np.dtype(self.dtype(i)), self.file_shape(i)
        if t._tab.Offset(16):  # sparsity parameters: the buffer holds the stored values only
            if len(raw) % dtype.itemsize:
                raise ModelFormatError(f"{self.where}: sparse tensor {i} ('{self.tname(i)}') has {len(raw)} bytes of "
                                       f"{dtype.name} values; the file may be corrupt")
            return self.dense_array(i, np.frombuffer(raw, dtype), shape)
        need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(raw) != need:
            raise ModelFormatError(f"{self.where}: tensor {i} ('{self.tname(i)}', {dtype.name} {list(shape)}) needs "
                                   f"{need} bytes of data, but its buffer has {len(raw)}; the file may be corrupt")
        return np.frombuffer(raw, dtype).reshape(shape).copy()

    def dense_array(self, i: int, values: np.ndarray, shape: tuple) -> np.ndarray:
        """A sparse tensor's dense array, as TFLite's sparsity format converter builds it: the
        stored values in traversal order, each level of the traversal dense (every index) or
        SPARSE_CSR (the indices array_segments / array_indices list under each parent); the
        levels past the tensor's rank are blocks of the dims the block map names."""
        what = f"sparse tensor {i} ('{self.tname(i)}')"
        order, block_map, levels = read_sparsity(self.buf, self.tensor(i)._tab.Pos, self.where, f"tensor {i}")

        def bad(why: str):
            raise ModelFormatError(f"{self.where}: {what} (shape {list(shape)}) has {why}; the file may be corrupt")

        n, k = len(shape), len(block_map)
        if sorted(order[:n]) != list(range(n)) or sorted(order[n:]) != list(range(n, n + k)) or \
                len(levels) != n + k:
            bad(f"the traversal order {order} with {len(levels)} dimension metadata and the block map {block_map}")
        if block_map != sorted(set(block_map)) or any(not 0 <= b < n for b in block_map):
            bad(f"the block map {block_map}")
        level_of = {d: order.index(d) for d in range(n + k)}
        block = [levels[level_of[n + j]][1] for j in range(k)]
        expanded = list(shape) + block
        for j, d in enumerate(block_map):
            if block[j] < 1 or shape[d] % block[j]:
                bad(f"the block size {block[j]} for dim {d}")
            expanded[d] = shape[d] // block[j]
        pos = np.zeros(1, np.int64)  # each entry's position in its level (a parent index for the next)
        coords = np.zeros((1, 0), np.int64)
        for level, (fmt, dense_size, segments, indices) in enumerate(levels):
            size = expanded[order[level]]
            if fmt == 0:  # DENSE
                if dense_size != size:
                    bad(f"the dense size {dense_size} at level {level}, whose dim is {size}")
                new = np.arange(size, dtype=np.int64)
                coords = np.concatenate([np.repeat(coords, size, 0), np.tile(new, len(pos))[:, None]], 1)
                pos = (pos[:, None] * size + new).reshape(-1)
            elif fmt == 1:  # SPARSE_CSR
                if segments is None or indices is None or len(segments) < 1 or \
                        (len(pos) and int(pos.max()) + 1 >= len(segments)) or np.any(np.diff(segments) < 0) or \
                        segments[0] < 0 or segments[-1] > len(indices) or \
                        np.any((indices < 0) | (indices >= size)):
                    bad(f"array_segments / array_indices at level {level} that do not index a dim of {size}")
                starts, counts = segments[pos], segments[pos + 1] - segments[pos]
                if counts.sum() > values.size:
                    bad(f"more stored entries than its {values.size} values")
                pos = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
                coords = np.concatenate([np.repeat(coords, counts, 0), indices[pos][:, None]], 1)
            else:
                bad(f"the dimension format {fmt} at level {level} (DENSE is 0, SPARSE_CSR 1)")
            if len(pos) > values.size:
                bad(f"more stored entries than its {values.size} values")
        if len(pos) != values.size:
            bad(f"{values.size} stored values where its sparsity parameters index {len(pos)}")
        index = [coords[:, level_of[d]] for d in range(n)]
        for j, d in enumerate(block_map):
            index[d] = index[d] * block[j] + coords[:, level_of[n + j]]
        dense = np.zeros(shape, values.dtype)
        dense[tuple(index)] = values
        return dense

    def const(self, i: int, what: str) -> np.ndarray:
        data = self.data(i)
        if data is None:
            self.refuse(f"takes {what} computed at run time; npuforge imports constant {what} only")
        return data

    def qparams(self, i: int, dtype: str = "int8") -> QParams | None:
        """The file's quantization of a tensor: per tensor, or per channel along its axis (file layout)."""
        q = self.tensor(i).Quantization()
        if q is None or q.ScaleLength() == 0:
            return None
        scale = q.ScaleAsNumpy().astype(np.float32)
        zp = q.ZeroPointAsNumpy() if q.ZeroPointLength() else np.zeros(scale.shape, np.int64)
        # (lengths and axis: verify_model); the values must be usable as they are
        if not np.all(np.isfinite(scale) & (scale > 0)) or np.any((zp < -2**31) | (zp >= 2**31)):
            raise ModelFormatError(f"{self.where}: tensor {i} ('{self.tname(i)}') has the quantization scale(s) "
                                   f"{scale[:4].tolist()} and zero point(s) {zp[:4].tolist()}; scales must be "
                                   f"positive and finite, zero points int32")
        if scale.size == 1:
            return QParams(dtype, scale[0], np.asarray(zp).reshape(-1)[0])
        return QParams(dtype, scale, np.asarray(zp), q.QuantizedDimension())

    def activation_q(self, i: int) -> QParams | None:
        """An activation's parameters in an int8 model (None in a float one, and for a float32 tensor of
        the float islands an int8 model may hold)."""
        if not self.quantized or (self.int8_model and self.dtype(i) == "float32"):
            return None
        p = self.qparams(i)
        if self.dtype(i) != "int8" or p is None or p.per_channel:
            self.refuse(f"has the {self.dtype(i)} tensor '{self.tname(i)}' in an int8 model; npuforge imports "
                        f"models whose activations are all int8, quantized per tensor")
        return p

    # -- errors ------------------------------------------------------------------------
    def refuse(self, why: str):
        raise UnsupportedError(f"{self.where}: {self.at} {why}")

    # -- IR values -----------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name = self.graph.unique_name(base)
        self.graph.add_value(Value(name, "float32", None))  # reserved; emit() records the shape
        return name

    def add_const(self, base: str, data: np.ndarray, quant: QParams | None = None) -> str:
        name = self.graph.unique_name(base)
        v = self.graph.add_const(name, data)
        v.quant = quant
        self.infos[name] = TensorInfo(v.dtype, v.shape, v.data)
        return name

    def int64s(self, base: str, values) -> str:
        return self.add_const(base, np.asarray(values, np.int64))

    def value(self, i: int, rank: int | None = None) -> str:
        """The IR value of tensor i; ``rank`` 4 lifts a lower-rank operand broadcast against a
        4-D result to 4-D (NHWC broadcasting, then NCHW)."""
        data = None if i in self.names else self.data(i)
        shape = self.file_shape(i)
        lift = rank == 4 and 0 < len(shape) < 4 and int(np.prod(shape)) > 1
        if data is None:
            name = self.names.get(i)
            if name is None:
                raise ModelFormatError(f"{self.where}: {self.at} reads tensor {i} ('{self.tname(i)}'), which no "
                                       f"operator or input provides")
            if not lift:
                return name
            nhwc = (1,) * (4 - len(shape)) + shape
            return self.reshape(name, shape, nhwc, self.graph.values[name].quant)
        quant = None
        if self.int8_model and data.dtype.kind in "iu" and self.qparams(i) is not None:  # (an island too)
            p = self.qparams(i, self.dtype(i))
            quant = p
            data = p.dequantize(data)
        elif data.dtype == np.float16:
            data = data.astype(np.float32)
        if lift:
            data = data.reshape((1,) * (4 - data.ndim) + data.shape)
        if data.ndim == 4:
            data = data.transpose(TO_IR)
            if quant is not None and quant.per_channel:
                quant = QParams(quant.dtype, quant.scale, quant.zero_point, IR_AXIS[quant.axis])
        return self.add_const(self.tname(i), data, quant)

    def emit(self, op: str, inputs: list, attrs: dict | None = None, out: str | None = None,
             quant: QParams | None = None, suffix: str = "", outs: list[str] | None = None) -> Node:
        """Append an IR node (every attribute default filled); its outputs' shapes by inference.
        ``out`` names its one output (``outs`` the outputs of an op with several), ``quant`` the
        first output's parameters."""
        defaults = get_op(op).attrs
        full = {k: copy.deepcopy(v) for k, v in defaults.items()}
        full.update(attrs or {})
        names = outs or [out or self.fresh(f"{self.base}::{suffix or op.lower()}")]
        node_name = self.node_base + (f"::{suffix}" if suffix else "")
        while node_name in self.origin:
            node_name += "_"
        node = Node(node_name, op, list(inputs), names, full)
        try:
            infos = infer_node(node, input_infos(node, self.infos))
        except NpuforgeError as e:
            raise type(e)(f"{self.where}: {self.at}: {e}") from None
        for k, (name, info) in enumerate(zip(names, infos)):
            self.infos[name] = info
            self.graph.values[name] = Value(name, info.dtype, tuple(info.shape), quant=quant if k == 0 else None)
        self.graph.nodes.append(node)
        self.origin[node.name] = self.at
        return node

    def bind(self, o: int, name: str) -> None:
        """Tensor o is IR value ``name``: its shape must be the file's (permuted)."""
        want, got = ir_shape(self.file_shape(o)), tuple(self.graph.values[name].shape)
        if want != got:
            raise ModelFormatError(f"{self.where}: {self.at}: output '{self.tname(o)}' has shape {list(want)} "
                                   f"(NCHW) in the file, but the IR computes {list(got)}")
        have, file_q = self.graph.values[name].quant, self.activation_q(o)
        if file_q is not None and not (have is not None and have.same_as(file_q)):
            self.refuse("has an output quantized differently from its input; npuforge moves int8 codes through "
                        "it unchanged (TFLite would requantize them)")
        self.names[o] = name

    # -- layout ------------------------------------------------------------------------
    def transpose(self, x: str, perm, out: str | None = None) -> str:
        """x transposed; a transpose of a transpose is folded into one (none when they cancel)."""
        perm = list(perm)
        if x in self.transposed:
            x, first = self.transposed[x]
            perm = [first[p] for p in perm]
        if perm == list(range(len(perm))):
            return x
        y = self.emit("Transpose", [x], {"perm": perm}, out, self.graph.values[x].quant, "transpose").outputs[0]
        self.transposed[y] = (x, perm)
        return y

    def reshape(self, x: str, src, dst, quant, out: str | None = None) -> str:
        """x (the IR value of a file tensor shaped ``src``) reshaped as TFLite reshapes, to a file
        tensor shaped ``dst``: in the file's element order."""
        if orders_differ(src):
            x = self.transpose(x, TO_FILE)
        if orders_differ(dst):
            mid = self.emit("Reshape", [x, self.int64s(f"{self.base}::shape", dst)], quant=quant,
                            suffix="reshape").outputs[0]
            return self.transpose(mid, TO_IR, out)
        if tuple(self.graph.values[x].shape) == ir_shape(dst):
            return x
        return self.emit("Reshape", [x, self.int64s(f"{self.base}::shape", ir_shape(dst))], out=out,
                         quant=quant, suffix="reshape").outputs[0]

    def axis(self, axis: int, rank: int) -> int:
        if not -max(rank, 1) <= axis < max(rank, 1):
            self.bad(f"the axis {axis} for a rank-{rank} tensor")
        axis = axis % rank if rank else 0
        return IR_AXIS[axis] if rank == 4 else axis

    def pads(self, code: int, x: int, kernel, strides, dilations) -> list:
        """[top, left, bottom, right] of TF's SAME (or VALID) padding."""
        if code == Padding.VALID:
            return [0, 0, 0, 0]
        total = [max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
                 for n, k, s, d in zip(self.file_shape(x)[1:3], kernel, strides, dilations)]
        return [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]

    # -- graph ---------------------------------------------------------------------------
    def op_name(self, index: int) -> str:
        code_table = self.model.OperatorCodes(self.sg.Operators(index).OpcodeIndex())
        code = max(code_table.BuiltinCode(), code_table.DeprecatedBuiltinCode())
        if code == BuiltinOperator.CUSTOM:
            custom = code_table.CustomCode()
            return f"the custom op '{_text(custom) if custom else '?'}'"
        return _OP_NAMES.get(code, f"builtin {code}")

    def options(self, op, cls: str | None):
        table = op.BuiltinOptions()
        if cls is None or table is None:
            return _NoOptions()
        verify_options(table, cls, self.where, self.at)
        opt = getattr(tflite, cls)()
        opt.Init(table.Bytes, table.Pos)
        return opt

    def op_tensors(self, k: int) -> tuple[list, list]:
        """Operator k's input and output tensor indices (-1: an omitted optional input)."""
        op = self.sg.Operators(k)
        return ([int(i) for i in op.InputsAsNumpy()] if op.InputsLength() else [],
                [int(i) for i in op.OutputsAsNumpy()] if op.OutputsLength() else [])

    def in_float(self, k: int) -> bool:
        """Whether operator k of an int8 model computes in float: every tensor it reads or writes at run
        time is float32 (the converter's float islands, between a DEQUANTIZE and a QUANTIZE)."""
        ins, outs = self.op_tensors(k)
        computed = [t for t in ins + outs if t >= 0 and not self.has_data(t)]
        return bool(computed) and all(self.dtype(t) == "float32" for t in computed)

    def consumers(self, t: int) -> list[int]:
        return [k for k in range(self.sg.OperatorsLength()) if t in self.op_tensors(k)[0]]

    def boundary(self) -> list[str]:
        """The IR inputs (QUANTIZE after a float input dropped) and the outputs' tensors."""
        outputs = [int(t) for t in self.sg.OutputsAsNumpy()]
        inputs = []
        for t in (int(t) for t in self.sg.InputsAsNumpy()):
            users = self.consumers(t)
            if self.int8_model and self.dtype(t) == "float32" and len(users) == 1 and \
                    self.op_name(users[0]) == "QUANTIZE" and t not in outputs:
                self.skip.add(users[0])
                t = self.op_tensors(users[0])[1][0]
            elif self.dtype(t) not in ("int32", "int64") and (  # (int32 / int64: token ids, either model)
                    self.dtype(t) not in ("float32", "int8") or (self.dtype(t) == "int8") != self.int8_model):
                raise UnsupportedError(f"{self.where}: graph input '{self.tname(t)}' is {self.dtype(t)}; npuforge "
                                       f"imports float32 inputs, int8 ones of int8 models and integer ids")
            self.at = f"graph input '{self.tname(t)}'"
            name = self.add_value_input(t)
            inputs.append(name)
        return inputs

    def add_value_input(self, t: int) -> str:
        name = self.fresh(self.tname(t))
        ids = self.dtype(t) in ("int32", "int64")  # token ids: integers as they are, no parameters
        v = Value(name, self.dtype(t) if ids else "float32", ir_shape(self.file_shape(t)),
                  quant=None if ids else self.activation_q(t))
        self.graph.values[name] = v
        self.infos[name] = TensorInfo(v.dtype, v.shape)
        self.names[t] = name
        return name

    def run(self) -> Graph:
        g = self.graph
        g.inputs = self.boundary()
        producer = {t: k for k in range(self.sg.OperatorsLength()) for t in self.op_tensors(k)[1]}
        outputs = []
        for t in (int(t) for t in self.sg.OutputsAsNumpy()):
            k = producer.get(t)
            if self.int8_model and k is not None and self.op_name(k) == "DEQUANTIZE" and self.dtype(t) == "float32":
                self.skip.add(k)  # the IR output is the int8 side
                t = self.op_tensors(k)[0][0]
            outputs.append(t)
        for index in range(self.sg.OperatorsLength()):
            if index in self.skip:
                continue
            name = self.op_name(index)
            self.at = f"operator {index} ({name})"
            handler = self.HANDLERS.get(name) or self.custom_handler(index)  # (an unknown custom op: refused)
            if handler is None:
                raise UnsupportedError(f"{self.where}: operator {index} is {name}, which npuforge does not import "
                                       f"(docs/tflite.md lists the TFLite operators it reads)")
            ins, outs = self.op_tensors(index)
            if len(outs) != self.OUTPUTS.get(handler[0], 1):
                self.refuse(f"has {len(outs)} outputs; npuforge imports {self.OUTPUTS.get(handler[0], 1)}")
            while ins and ins[-1] < 0:
                ins.pop()  # omitted optional inputs (a bias)
            if len(ins) < self.ARITY.get(handler[0], 1):
                self.bad(f"{len(ins)} input(s); {name} takes at least {self.ARITY.get(handler[0], 1)}")
            if min(ins) < 0 and handler[0] not in self.SPARSE_INPUTS:  # else an optional input is the last
                self.bad(f"the inputs {ins}, omitting one before the last")
            self.quantized = self.int8_model and not self.in_float(index)
            label = name if name in self.HANDLERS else handler[0]  # a custom op: its rule's name
            self.base, self.node_base = self.tname(outs[0]), f"{label.lower()}_{index}"
            self.op_index = index
            try:
                getattr(self, handler[0])(ins, outs[0], self.options(self.sg.Operators(index), handler[1]),
                                          *handler[2:])
            except (IndexError, KeyError, TypeError, ValueError) as e:  # too few inputs, bad dims, ...
                raise ModelFormatError(f"{self.where}: {self.at} cannot be read ({type(e).__name__}: {e}); "
                                       f"the file may be corrupt") from None
        self.at = "the graph outputs"
        for t in outputs:
            if t not in self.names:
                raise UnsupportedError(f"{self.where}: graph output '{self.tname(t)}' is a constant or not computed")
        g.outputs = [self.names[t] for t in outputs]
        self.name_outputs(outputs)
        self.prune()
        if self.int8_model:
            self.integers()
        g.check()
        return g

    def name_outputs(self, outputs: list[int]) -> None:
        """Each graph output takes its file tensor's name where the import bound that tensor to another
        value (an output that is a no-op STRIDED_SLICE or RESHAPE of an inner tensor): the name users and
        the reference runtime know it by. A graph input, or a value that is two outputs, keeps its name."""
        g = self.graph
        for t in outputs:
            old, new = self.names[t], self.tname(t)
            if old == new or new in g.values or old in g.inputs or g.outputs.count(old) != 1:
                continue
            rename_value(g, old, new)
            self.names = {k: (new if n == old else n) for k, n in self.names.items()}

    def prune(self) -> None:
        """Drop Transposes left unread by folding, and values nothing refers to."""
        g = self.graph
        while True:
            read = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
            dead = [n for n in g.nodes if n.outputs[0] not in read]
            if not dead:
                break
            g.nodes = [n for n in g.nodes if n not in dead]
        used = {i for n in g.nodes for i in n.inputs + n.outputs} | set(g.inputs) | set(g.outputs)
        used |= {c for n in g.nodes for c in n.quant.values()}
        g.values = {k: v for k, v in g.values.items() if k in used}

    def integers(self) -> None:
        """Each node's integers as the quantizer stores them: Conv / Gemm and activation tables have
        theirs from the file already; the others get the quantizer's own rule for their kind."""
        g = self.graph
        config = QuantConfig(**TFLITE_CONFIG)
        for node in g.nodes:
            kind = get_op(node.op).quant_kind(node, g)
            self.at = self.origin[node.name]
            island = all(g.values[o].quant is None for o in node.outputs if o)  # float in the file
            if island or (node.op == "Identity" and runs_in_float(g, node, kind)):  # (or its QUANTIZE)
                self.float_islands.append(node.name)
                continue
            if kind in _SHARED_GRID:
                out = g.values[node.outputs[0]].quant
                for i in node.inputs[:None if kind == "concat" else 1]:
                    if g.values[i].quant is None or not g.values[i].quant.same_as(out):
                        self.refuse("has inputs and output quantized differently; npuforge moves int8 codes "
                                    "through it unchanged (TFLite requantizes them)")
            if kind in (None, "shape"):
                self.refuse("on int8 tensors has no integer rule in npuforge, so it is not imported quantized")
            if kind in ("passthrough", "concat") or node.quant:
                continue
            _quantize_node(g, node, kind, config, [])
            if not node.quant:  # the simulator would run it in float
                self.refuse(f"on int8 tensors has no integer rule of kind '{kind}' in npuforge")
        g.metadata["quantization"] = {"config": config.to_dict(), "source": "tflite",
                                      "quantized_nodes": len(g.nodes) - len(self.float_islands),
                                      "float_nodes": list(self.float_islands), "int16_concats": []}


def import_tflite(path_or_bytes, name: str | None = None) -> Graph:
    """A ``.tflite`` file (path or bytes) -> a checked npuforge Graph, NCHW (see the module
    docstring): 4-D inputs and outputs are LiteRT's NHWC tensors transposed by (0, 3, 1, 2).
    An int8 model becomes a quantized graph for :class:`npuforge.sim.integer.IntegerSimulator`."""
    if isinstance(path_or_bytes, (str, os.PathLike)):
        path = Path(path_or_bytes)
        if not path.is_file():
            raise ModelFormatError(f"{path}: no such file")
        buf, where, stem = path.read_bytes(), str(path), path.stem
    else:
        buf, where, stem = bytes(path_or_bytes), name or "<tflite model>", name or "tflite"
    if not is_tflite(buf[:8]):
        raise ModelFormatError(f"{where}: not a TFLite flatbuffer (no 'TFL3' identifier at bytes 4..8)")
    try:
        return _Importer(buf, where, name or stem).run()
    except (struct.error, ValueError, TypeError, IndexError) as e:
        # tflite_verify checks what the importer reads; should a read it missed still fail inside the
        # flatbuffers runtime, it is the file's fault, not npuforge's
        if not _raised_by_flatbuffers(e):
            raise
        raise ModelFormatError(f"{where}: corrupt or truncated TFLite file ({type(e).__name__}: {e})") from None


def _raised_by_flatbuffers(e: BaseException) -> bool:
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and Path(frames[-1].filename).parent in _FLATBUFFER_CODE


_FLATBUFFER_CODE = {Path(flatbuffers.__file__).parent, Path(tflite.__file__).parent}
