"""Empirical bias correction (Nagel et al. 2019, section 4.2; AIMET's empirical form).

Rounding weights and activations shifts a layer's mean output: E[W_q x_q] !=
E[W x]. Per output channel the shift is measured on the calibration images and
subtracted from the layer's bias, before the fused activation:

    b <- b - (mean(conv(x_q, W_q) + b) - mean(conv(x, W) + b))

where x is the float network's input to the layer and x_q the quantized
network's. Layers are corrected in order (``run_layerwise``), each measured
with every earlier correction in place, so corrections do not compound.
"""

from __future__ import annotations

import numpy as np
import torch

from ..ops.registry import get_op
from .layerwise import float_data, run_layerwise, without_activation


def _channel_mean(t: torch.Tensor) -> np.ndarray:
    per_image = t.reshape(t.shape[0], t.shape[1], -1).sum(dim=2) if t.dim() > 2 else t  # float32, a row at a time
    return (per_image.double().sum(dim=0) / (t.numel() / t.shape[1])).numpy()


def correct_bias(graph, feeds: list[dict], compute_nodes: set, progress=None) -> dict:
    """Correct the biases of ``compute_nodes`` (names) of the quantized ``graph`` in
    place, from ``feeds`` (input batches, {name: array}): the float bias and its
    int32 constant. -> report {corrected, mean_abs_shift, without_bias}."""
    has_bias = {n.name for n in graph.nodes if n.name in compute_nodes and len(n.inputs) > 2 and n.inputs[2]
                and graph.values[n.inputs[2]].is_const and "bias" in n.quant}
    shifts = []

    def visit(node, xs_f, xs_q, pre_f):
        pre_q = get_op(node.op).forward(without_activation(node), xs_q)[0]
        shift = _channel_mean(pre_q) - _channel_mean(pre_f)
        bias = graph.values[node.inputs[2]]
        bias.float_data = float_data(bias)  # as AdaRound's weights: a later pass runs the float network
        bias.data = (bias.data.astype(np.float64) - shift.reshape(bias.data.shape)).astype(bias.data.dtype)
        graph.values[node.quant["bias"]].data = bias.quant.quantize(bias.data)
        shifts.append(float(np.abs(shift).mean()))

    run_layerwise(graph, feeds, has_bias, visit, progress)
    return {"corrected": len(shifts), "mean_abs_shift": float(np.mean(shifts)) if shifts else 0.0,
            "without_bias": sorted(compute_nodes - has_bias)}
