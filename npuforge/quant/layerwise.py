"""Layer-by-layer passes over all calibration images at once: bias correction
and AdaRound change a layer from what its inputs look like in the float and in
the quantized network, with every earlier layer's change already in place.

The float network and the fake-quantized network run side by side, node by
node (node-major, so a change to node k is seen by node k + 1). Memory grows
with the number of images: about 1 GB per 100 images at 224x224 for
EfficientNet-Lite0 (two copies of the largest activations). A model that fixes
its batch (most exported files: 1) has each op run on that many images at a
time, the activations joined again, so shape constants such as a Reshape's
``[1, -1]`` hold.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ..errors import NpuforgeError
from ..ops.activation import apply_fused
from ..ops.registry import get_op
from ..sim.float_exec import check_feeds, last_uses


def float_data(value) -> np.ndarray:
    """A constant's float data, as the float network computes with it.

    AdaRound writes the weights it rounds onto their int8 grid (every engine quantizes
    ``data``, so that is where the learnt rounding must live) and keeps the float
    weights beside them, in memory only, as ``value.float_data`` (bias correction does
    the same with the biases it corrects). A later layer-wise pass of the same quantize
    call (bias correction after AdaRound) must run the float network with those: with
    the grid weights it would measure the quantized network against one whose weights
    are already rounded, i.e. correct only the activations' share of each layer's
    shift, towards the wrong outputs."""
    return getattr(value, "float_data", value.data)


def const_tensor(value, quantized: bool) -> torch.Tensor:
    if quantized:
        data = value.data if value.quant is None else value.quant.dequantize(value.quant.quantize(value.data))
    else:
        data = float_data(value)
    return torch.from_numpy(np.array(data, copy=True))


def without_activation(node):
    """A shallow copy of a Conv / Gemm with its fused activation removed (its pre-activation);
    the node itself for ops that carry none (MatMul, ConvTranspose)."""
    if not node.attrs.get("activation"):
        return node
    linear = copy.copy(node)
    linear.attrs = {**node.attrs, "activation": "", "activation_params": []}
    return linear


def fixed_batch(graph) -> int | None:
    """The batch size the model's first input fixes, or None when its batch dim is symbolic."""
    shape = graph.values[graph.inputs[0]].shape
    return shape[0] if shape and isinstance(shape[0], int) else None


def run_layerwise(graph, feeds: list[dict], nodes: set, visit, progress=None) -> None:
    """Run ``graph`` float and fake-quantized over all ``feeds`` (batches {name: array}).

    For each node named in ``nodes`` (quantized compute nodes), before the quantized side
    computes it, ``visit(node, xs_f, xs_q, pre_f)`` is called with the float
    and quantized inputs (tensors, constants included as the fake-quant run
    sees them) and the float pre-activation output; it may change the node's
    constants (weights, bias and their integer forms), which the quantized
    side then uses. ``progress(done, total)`` follows the visited nodes.
    """
    from .calibrate import split_to_fixed_batch  # (calibrate imports this module)

    fixed = fixed_batch(graph)
    checked = [check_feeds(graph, part) for f in feeds for part in split_to_fixed_batch(graph, f)]
    # images in NHWC memory order: torch's CPU convolutions keep it through the network and run
    # 1.5x faster on it (depthwise ones 5x); the per-layer means differ only in float rounding
    env_f = {name: _nhwc(torch.cat([c[name] for c in checked])) for name in graph.inputs}
    total = len(env_f[graph.inputs[0]])
    if fixed is not None and total % fixed:
        raise NpuforgeError(f"bias correction and AdaRound run the {total} calibration images in batches of "
                            f"{fixed}, the model's fixed batch: give a multiple of {fixed} images")
    env_q = {name: graph.values[name].quant.fake_quant(t) if graph.values[name].quant is not None else t
             for name, t in env_f.items()}
    forward = _in_batches(fixed, total)
    last_use = last_uses(graph)
    keep = set(graph.outputs)
    done = 0

    def gather(env, node, quantized):
        return [None if not n else env[n] if n in env else const_tensor(graph.values[n], quantized)
                for n in node.inputs]

    with torch.no_grad():
        for index, node in enumerate(graph.nodes):
            op = get_op(node.op)
            xs_f = gather(env_f, node, False)
            batched = [bool(n) and n in env_f for n in node.inputs]  # activations carry the batch
            if node.name in nodes:
                pre_f = forward(op, without_activation(node), xs_f, batched)[0]
                visit(node, xs_f, gather(env_q, node, True), pre_f)
                ys_f = [apply_fused(node, pre_f)]
                done += 1
                if progress is not None:
                    progress(done, len(nodes))
            else:
                ys_f = forward(op, node, xs_f, batched)
            ys_q = forward(op, node, gather(env_q, node, True), batched)
            for name, yf, yq in zip(node.outputs, ys_f, ys_q):
                p = graph.values[name].quant
                env_f[name], env_q[name] = yf, (p.fake_quant(yq) if p is not None else yq)
            for name in set(node.inputs):
                if name and last_use.get(name) == index and name not in keep and name in env_f:
                    del env_f[name], env_q[name]


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t


def _in_batches(fixed: int | None, total: int):
    """``forward(op, node, xs, batched)``: the op on all ``total`` images at once, or, for a model that
    fixes its batch (a TFLite import's 1, a Reshape to [1, ...]), on each run of ``fixed`` images of
    the activations (``batched``; constants whole), the outputs joined again."""
    def forward(op, node, xs, batched):
        if fixed is None or fixed == total:
            return op.forward(node, xs)
        parts = []
        for start in range(0, total, fixed):
            parts.append(op.forward(node, [x[start:start + fixed] if flag and x.dim() and x.shape[0] == total else x
                                           for x, flag in zip(xs, batched)]))
        return [torch.cat(outs) for outs in zip(*parts)]

    return forward
