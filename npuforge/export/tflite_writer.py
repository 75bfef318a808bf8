"""Write a TFLite flatbuffer: tensors, buffers and operators in, ``.tflite`` bytes out.

Built with the generated schema functions of the ``tflite`` package (``<Table>Start``,
``<Table>Add<Field>``, ``<Table>End``) and the ``flatbuffers`` builder; this module
knows nothing of the npuforge IR (see :mod:`npuforge.export.tflite_export`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import flatbuffers
import numpy as np

from ..errors import NpuforgeError

TENSOR_TYPES = {"float32": 0, "float16": 1, "int32": 2, "uint8": 3, "int64": 4, "bool": 6, "int16": 7, "int8": 9}
_ACTIVATIONS = {"": 0, "Relu": 1, "ReluN1To1": 2, "Relu6": 3}
BUFFER_ALIGNMENT = 16  # constant data aligned as TFLite's own converter aligns it


def _schema(name: str):
    return importlib.import_module(f"tflite.{name}")


def table(builder, name: str, **fields):
    """One table of the schema: ``fields`` maps each field's CamelCase name (as the generated
    ``<name>Add<Field>`` functions spell it) to a scalar or an already-built offset."""
    mod = _schema(name)
    getattr(mod, f"{name}Start")(builder)
    for key, value in fields.items():
        getattr(mod, f"{name}Add{key}")(builder, value)
    return getattr(mod, f"{name}End")(builder)


def _vector(builder, values, dtype) -> int:
    return builder.CreateNumpyVector(np.ascontiguousarray(values, dtype=dtype).reshape(-1))


def _offsets(builder, name: str, field: str, offsets: list) -> int:
    getattr(_schema(name), f"{name}Start{field}Vector")(builder, len(offsets))
    for off in reversed(offsets):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()


def _bytes(builder, data: bytes) -> int:
    builder.StartVector(1, len(data), BUFFER_ALIGNMENT)
    builder.head -= len(data)
    builder.Bytes[builder.head:builder.head + len(data)] = data
    return builder.EndVector()


@dataclass
class TensorQuant:
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0  # TFLite's quantized_dimension (used when scale has more than one element)


@dataclass
class _Tensor:
    name: str
    shape: tuple
    dtype: str
    buffer: int
    quant: TensorQuant | None
    variable: bool = False  # state the interpreter keeps between invocations (an LSTM's h and c)
    signature: tuple | None = None  # shape_signature: -1 where the dim is dynamic


@dataclass
class _Operator:
    opcode: int
    inputs: list
    outputs: list
    options_type: int
    options: tuple  # (table name, fields) or None
    intermediates: list = field(default_factory=list)  # tensors a kernel keeps parameters in (int8 LSTM)


class TFLiteWriter:
    """Collects one subgraph and writes it (``finish``)."""

    def __init__(self):
        self.tensors: list[_Tensor] = []
        self.buffers: list[bytes] = [b""]  # buffer 0 is the empty buffer, by convention
        self.operators: list[_Operator] = []
        self.opcodes: dict[tuple, int] = {}  # (builtin code, version) -> index
        self.by_name: dict[str, int] = {}

    def tensor(self, name: str, shape, dtype: str, data: np.ndarray | None = None,
               quant: TensorQuant | None = None, variable: bool = False, signature=None) -> int:
        if dtype not in TENSOR_TYPES:
            raise NpuforgeError(f"tensor '{name}': dtype {dtype} has no TFLite type")
        buffer = 0
        if data is not None:
            self.buffers.append(np.ascontiguousarray(data).tobytes())
            buffer = len(self.buffers) - 1
        self.tensors.append(_Tensor(name, tuple(int(d) for d in shape), dtype, buffer, quant, variable,
                                    None if signature is None else tuple(int(d) for d in signature)))
        self.by_name[name] = len(self.tensors) - 1
        return len(self.tensors) - 1

    def operator(self, builtin: int, inputs: list, outputs: list, options: str | None = None,
                 options_type: int = 0, version: int = 1, intermediates: list | None = None, **fields) -> None:
        key = (builtin, version)
        if key not in self.opcodes:
            self.opcodes[key] = len(self.opcodes)
        self.operators.append(_Operator(self.opcodes[key], list(inputs), list(outputs), options_type,
                                        (options, fields) if options else None, list(intermediates or [])))

    def finish(self, inputs: list, outputs: list, description: str = "npuforge") -> bytes:
        b = flatbuffers.Builder(1024 + sum(len(d) for d in self.buffers))
        buffers = [table(b, "Buffer", Data=_bytes(b, d)) if d else table(b, "Buffer") for d in self.buffers]
        tensors = []
        for t in self.tensors:
            name = b.CreateString(t.name)
            shape = _vector(b, t.shape, np.int32)
            signature = None if t.signature is None else _vector(b, t.signature, np.int32)
            quant = None
            if t.quant is not None:
                scale = _vector(b, t.quant.scale, np.float32)
                zp = _vector(b, t.quant.zero_point, np.int64)
                quant = table(b, "QuantizationParameters", Scale=scale, ZeroPoint=zp,
                              QuantizedDimension=int(t.quant.axis))
            fields = {"Shape": shape, "Type": TENSOR_TYPES[t.dtype], "Buffer": t.buffer, "Name": name}
            if quant is not None:
                fields["Quantization"] = quant
            if t.variable:
                fields["IsVariable"] = True
            if signature is not None:
                fields["ShapeSignature"] = signature
            tensors.append(table(b, "Tensor", **fields))
        operators = []
        for op in self.operators:
            ins, outs = _vector(b, op.inputs, np.int32), _vector(b, op.outputs, np.int32)
            fields = {"OpcodeIndex": op.opcode, "Inputs": ins, "Outputs": outs}
            if op.intermediates:
                fields["Intermediates"] = _vector(b, op.intermediates, np.int32)
            if op.options is not None:
                name, opts = op.options
                opts = {k: (_vector(b, v, np.int32) if isinstance(v, (list, tuple, np.ndarray)) else v)
                        for k, v in opts.items()}
                fields["BuiltinOptionsType"] = op.options_type
                fields["BuiltinOptions"] = table(b, name, **opts)
            operators.append(table(b, "Operator", **fields))
        subgraph = table(b, "SubGraph",
                         Tensors=_offsets(b, "SubGraph", "Tensors", tensors),
                         Inputs=_vector(b, inputs, np.int32), Outputs=_vector(b, outputs, np.int32),
                         Operators=_offsets(b, "SubGraph", "Operators", operators),
                         Name=b.CreateString("main"))
        codes = [table(b, "OperatorCode", DeprecatedBuiltinCode=min(code, 127), BuiltinCode=code, Version=version)
                 for (code, version) in sorted(self.opcodes, key=self.opcodes.get)]
        model = table(b, "Model", Version=3,
                      OperatorCodes=_offsets(b, "Model", "OperatorCodes", codes),
                      Subgraphs=_offsets(b, "Model", "Subgraphs", [subgraph]),
                      Description=b.CreateString(description),
                      Buffers=_offsets(b, "Model", "Buffers", buffers))
        b.Finish(model, file_identifier=b"TFL3")
        return bytes(b.Output())


def fused_activation(name: str) -> int:
    return _ACTIVATIONS[name]
