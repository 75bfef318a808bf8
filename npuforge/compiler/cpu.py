"""CPU commands: a node the target cannot run stays in the program and runs on the host CPU.

The command's parameter block holds the node as a one-node npuforge IR (its op, attributes, the
integers the quantizer stored on it, its values' parameters and shapes): text, a NUL, then the
safetensors bytes of its larger constants. The program simulator runs it with the integer
simulator's own kernel for that node (:meth:`IntegerSimulator.run_node`), so a CPU command computes
exactly what the integer simulator computes; a node the quantizer kept in float runs in float on
codes dequantized at its inputs, and its output is quantized where the value has parameters.

A CPU command reads and writes whole tensors in the program's layout (channel-last for 4-D
values, the IR's element order for every other rank) and converts them to the IR's shapes around
the kernel.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import ModelFormatError
from ..ir.graph import Graph, Value

BLOB_VERSION = b"npuforge-cpu 1\n"
STORED = ("int8", "uint8", "int16", "float32", "int32", "int64")  # what a program tensor holds


def value_dims(value) -> tuple:
    """The static shape of ``value`` (a symbolic batch is 1); ModelFormatError for other symbols."""
    dims = []
    for k, d in enumerate(value.shape or ()):
        if not isinstance(d, int):
            if k != 0:
                raise ModelFormatError(f"value '{value.name}': dynamic dimension '{d}' at axis {k}; fix the input "
                                       f"sizes (--input-shape) before compiling")
            d = 1
        dims.append(int(d))
    return tuple(dims)


def value_layout(value) -> tuple:
    """(dtype, h, w, c) of ``value`` in a program: codes of its quantized dtype, or its own dtype; a 4-D
    value channel-last ([N=1, C, H, W] as H x W x C); a 3-D one [1, L, D] as 1 x L x D and a 2-D one [L, D]
    as 1 x L x D (tokens: the IR's element order, each token a pixel of D channels); any other flat
    (1 x 1 x its elements)."""
    dtype = value.quant.dtype if value.quant is not None else value.dtype
    if dtype == "bool":
        dtype = "uint8"
    if dtype not in STORED:
        raise ModelFormatError(f"value '{value.name}' is {dtype}; a program stores {', '.join(STORED)}")
    dims = value_dims(value)
    if len(dims) == 4 and dims[0] == 1:
        return dtype, dims[2], dims[3], dims[1]
    if len(dims) == 3 and dims[0] == 1:
        return dtype, 1, dims[1], dims[2]
    if len(dims) == 2:  # rows of features ([1, K], or the tokens [L, D] of a flattened sequence)
        return dtype, 1, dims[0], dims[1]
    return dtype, 1, 1, int(np.prod(dims, dtype=np.int64))


def to_ir(arr: np.ndarray, value) -> np.ndarray:
    """A program tensor ([H, W, C] as stored) as the IR value's array."""
    dims = value_dims(value)
    if len(dims) == 4 and dims[0] == 1:
        return np.ascontiguousarray(arr.transpose(2, 0, 1)).reshape(dims)
    return arr.reshape(dims)


def from_ir(arr: np.ndarray, value) -> np.ndarray:
    """The IR value's array as a program tensor [H, W, C]."""
    _, h, w, c = value_layout(value)
    arr = np.asarray(arr)
    if arr.ndim == 4 and len(value_dims(value)) == 4 and value_dims(value)[0] == 1:
        return arr.reshape(c, h, w).transpose(1, 2, 0)
    return arr.reshape(h, w, c)


def node_graph(graph, node) -> Graph:
    """The one-node graph of ``node``: its non-constant inputs as graph inputs, its constants and the
    integers it stores, its outputs (named as in ``graph``)."""
    g = Graph(f"cpu:{node.name}")
    for name in node.inputs:
        if not name or name in g.values:
            continue
        v = graph.values[name]
        if v.is_const:
            g.add_value(Value(name, v.dtype, v.shape, v.data, v.quant))
        else:
            g.add_value(Value(name, v.dtype, v.shape, None, v.quant))
            g.inputs.append(name)
    for name in (node.quant or {}).values():
        if isinstance(name, str) and name in graph.values and name not in g.values:
            v = graph.values[name]
            g.add_value(Value(name, v.dtype, v.shape, v.data, v.quant))
    for name in node.outputs:
        if name:
            v = graph.values[name]
            g.add_value(Value(name, v.dtype, v.shape, None, v.quant))
            g.outputs.append(name)
    g.nodes.append(node)
    return g


def encode_node(graph, node) -> bytes:
    """The parameter-block blob of a CPU command running ``node``."""
    from safetensors.numpy import save as save_tensors

    from ..ir.textio import INLINE_LIMIT, dumps

    g = node_graph(graph, node)
    big = {v.name: np.ascontiguousarray(v.data) for v in g.constants() if v.data.size > INLINE_LIMIT}
    weights = save_tensors(big)
    text = dumps(g, "cpu", hashlib.sha256(weights).hexdigest())
    return BLOB_VERSION + text.encode("utf-8") + b"\0" + weights


def decode_node(blob: bytes, where: str) -> Graph:
    from safetensors.numpy import load as load_tensors

    from ..ir.textio import loads

    if not blob.startswith(BLOB_VERSION) or b"\0" not in blob:
        raise ModelFormatError(f"{where}: not a CPU command's node")
    text, _, weights = blob[len(BLOB_VERSION):].partition(b"\0")
    try:
        tensors = load_tensors(bytes(weights))
        graph = loads(text.decode("utf-8"), where, tensors)
    except ModelFormatError:
        raise
    except Exception as e:  # safetensors and UTF-8 raise their own types on a damaged blob
        raise ModelFormatError(f"{where}: the CPU command's node cannot be read ({type(e).__name__})") from None
    if len(graph.nodes) != 1:
        raise ModelFormatError(f"{where}: a CPU command holds {len(graph.nodes)} nodes, not one")
    problems = graph.problems()  # the IR checker: references, shapes, the integers the node stores
    if problems:
        raise ModelFormatError(f"{where}: its node is not sound ({problems[0]})")
    return graph


class CpuKernel:
    """Runs one node as the integer simulator does: ``run([input arrays]) -> [output arrays]`` with
    arrays in the IR's shapes (codes for quantized values, the value's own dtype otherwise)."""

    def __init__(self, graph: Graph):
        import torch  # noqa: F401  (the integer simulator's kernels are torch's)

        self.graph = graph
        self.node = graph.nodes[0]
        self.sim = None
        if any(v.quant is not None for v in graph.values.values()):
            from ..sim.integer import IntegerSimulator

            self.sim = IntegerSimulator(graph, "fixedpoint")

    def run_stored(self, inputs: list, index: int) -> np.ndarray:
        """Output ``index`` as a program tensor, from the inputs as program tensors."""
        ins = [to_ir(a, self.graph.values[n]) for a, n in zip(inputs, self.graph.inputs)]
        name = self.graph.outputs[index]
        y = self.run(ins)[self.node.outputs.index(name)]
        dtype = value_layout(self.graph.values[name])[0]
        return from_ir(y, self.graph.values[name]).astype(np.dtype(dtype) if dtype != "bool" else np.uint8)

    def run(self, inputs: list) -> list:
        import torch

        from ..ops.registry import get_op

        env = {name: torch.from_numpy(np.ascontiguousarray(arr)) for name, arr in zip(self.graph.inputs, inputs)}
        with torch.no_grad():
            if self.sim is not None:
                ys = self.sim.run_node(self.node, env)
            else:  # nothing quantized around it: the float forward
                consts = {v.name: torch.from_numpy(np.array(v.data)) for v in self.graph.constants()}
                ys = get_op(self.node.op).forward(self.node, [env.get(i, consts.get(i)) if i else None
                                                              for i in self.node.inputs])
        return [y.numpy() for y in ys]
