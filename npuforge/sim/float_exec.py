"""The float executor: runs the IR node by node with each op's torch forward.

Inputs are checked against the graph's declared dtypes and shapes (dynamic
dims bind once per run); intermediate tensors are freed after their last use.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import NpuforgeError, ShapeError
from ..ir import dtypes
from ..ir.graph import format_shape
from ..ops.registry import get_op


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    if not (array.flags.writeable and array.flags.c_contiguous):
        array = array.copy(order="C")
    return torch.from_numpy(array)


def check_feeds(graph, feeds: dict) -> dict:
    """Validated torch tensors for the graph inputs (float feeds cast to the declared float type)."""
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise NpuforgeError(f"unknown input '{unknown[0]}'; the graph's inputs are: {', '.join(graph.inputs)}")
    bound: dict[str, int] = {}
    out = {}
    for name in graph.inputs:
        if name not in feeds:
            raise NpuforgeError(f"input '{name}' is missing; the graph's inputs are: {', '.join(graph.inputs)}")
        v = graph.values[name]
        arr = np.asarray(feeds[name])
        want = dtypes.to_numpy(v.dtype)
        if arr.dtype != want:
            if np.issubdtype(arr.dtype, np.floating) and v.dtype in dtypes.FLOAT_DTYPES:
                arr = arr.astype(want)
            else:
                raise NpuforgeError(f"input '{name}' should be {v.dtype}, got {arr.dtype}")
        ok = arr.ndim == len(v.shape)
        for got, dim in zip(arr.shape, v.shape if ok else ()):
            if isinstance(dim, int):
                ok &= got == dim
            elif "*" not in dim and "+" not in dim:
                ok &= bound.setdefault(dim, got) == got
        if not ok:
            raise ShapeError(f"input '{name}' has shape {list(arr.shape)}, expected {format_shape(v.shape)}")
        out[name] = _as_tensor(arr)
    return out


def last_uses(graph) -> dict:
    """value name -> index of the last node that reads it (executors free it there)."""
    last_use = {}
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            last_use[name] = index
    return last_use


def execute(graph, feeds: dict, outputs: list[str] | None = None, *, value_hook=None, const_hook=None) -> dict:
    """Run the graph with each op's torch forward.

    ``value_hook(name, tensor) -> tensor`` sees (and may replace) every graph
    input and node output as it is produced: calibration observes through it,
    fake quantization rounds through it. ``const_hook(value, tensor) -> tensor``
    does the same once per constant.
    """
    wanted = list(outputs or graph.outputs)
    for name in wanted:
        if name not in graph.values:
            raise NpuforgeError(f"'{name}' is not a value of the graph")
    env: dict[str, torch.Tensor] = check_feeds(graph, feeds)
    if value_hook is not None:
        env = {name: value_hook(name, t) for name, t in env.items()}
    for v in graph.constants():
        t = _as_tensor(v.data)
        env[v.name] = const_hook(v, t) if const_hook is not None else t
    last_use = last_uses(graph)
    keep = set(wanted)
    with torch.no_grad():
        for index, node in enumerate(graph.nodes):
            xs = [env[name] if name else None for name in node.inputs]
            try:
                ys = get_op(node.op).forward(node, xs)
            except (RuntimeError, ValueError, IndexError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise NpuforgeError(f"node '{node.name}' ({node.op}) failed: {first}") from None
            for name, y in zip(node.outputs, ys):
                env[name] = value_hook(name, y) if value_hook is not None else y
            for name in set(node.inputs):  # a node may read one value twice: free it once
                if name and last_use.get(name) == index and name not in keep and not graph.values[name].is_const:
                    del env[name]
    return {name: env[name].numpy() for name in wanted}


def run_float(graph, feeds: dict, outputs: list[str] | None = None) -> dict:
    return execute(graph, feeds, outputs)
