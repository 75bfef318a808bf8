"""The graph IR: named values (dtype, shape, optional constant data) and nodes.

Nodes are kept in topological order. Each node's op is one of the ops registered
in :mod:`npuforge.ops`; its semantics are those of the ONNX operator of the same
name at opset 21, with every attribute present (defaults filled at import).
A dimension is an ``int`` or, for a dynamic axis such as the batch, a ``str``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

Dim = Union[int, str]
Shape = tuple  # tuple[Dim, ...]


def format_shape(shape) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass
class Value:
    name: str
    dtype: str
    shape: Shape | None
    data: np.ndarray | None = None  # set for constants (weights, folded tensors)
    quant: Any = None  # QParams (npuforge.quant.params) once quantized

    @property
    def is_const(self) -> bool:
        return self.data is not None

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}{format_shape(self.shape)}"


@dataclass
class Node:
    name: str
    op: str
    inputs: list  # value names; "" marks an omitted optional input
    outputs: list
    attrs: dict = field(default_factory=dict)
    # integers the quantizer decided for this node: role -> name of an integer
    # constant (weight, bias, multiplier, shift, lut, ...)
    quant: dict = field(default_factory=dict)

    def attr(self, key: str) -> Any:
        return self.attrs[key]


class Graph:
    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.metadata: dict = {}  # JSON-able facts about the graph (preprocessing, quantization config)

    # -- construction -------------------------------------------------------
    def add_value(self, value: Value) -> Value:
        self.values[value.name] = value
        return value

    def add_const(self, name: str, data: np.ndarray) -> Value:
        from .dtypes import from_numpy

        data = np.asarray(data)
        if not data.flags.c_contiguous:  # (np.ascontiguousarray would turn a scalar into 1-D)
            data = data.copy(order="C")
        return self.add_value(Value(name, from_numpy(data.dtype), tuple(data.shape), data))

    def unique_name(self, base: str) -> str:
        if base not in self.values:
            return base
        i = 1
        while f"{base}_{i}" in self.values:
            i += 1
        return f"{base}_{i}"

    # -- queries ------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def constants(self) -> list[Value]:
        return [v for v in self.values.values() if v.is_const]

    def op_histogram(self) -> dict[str, int]:
        return dict(sorted(Counter(n.op for n in self.nodes).items()))

    # -- behaviour (implemented in the modules that own each concern) -----
    def check(self) -> None:
        """Raise :class:`CheckError` listing every problem; return None if sound."""
        from .checker import check_graph

        check_graph(self)

    def problems(self) -> list[str]:
        from .checker import find_problems

        return find_problems(self)

    def run(self, feeds: dict, outputs: list[str] | None = None) -> dict:
        """Run in float with torch kernels: {input name: ndarray} -> {output name: ndarray}."""
        from ..sim.float_exec import run_float

        return run_float(self, feeds, outputs)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={self.inputs}, outputs={self.outputs})"
