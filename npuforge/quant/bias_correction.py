"""Empirical bias correction (Nagel et al. 2019, section 4.2; AIMET's empirical form).

Rounding weights and activations shifts a layer's mean output: E[W_q x_q] !=
E[W x]. Per output channel the shift is measured on the calibration images and
subtracted from the layer's bias, before the fused activation:

    b <- b - mean over M of (conv(x_q, W_q) + b - (conv(x, W) + b))

where x is the float network's input to the layer, x_q the quantized
network's, and M the positions (images x pixels) where the float output is in
the fused activation's linear part (all positions without an activation). A
change of bias reaches the layer's output only there; where Relu / ReLU6 clip,
the pre-activation error is not seen downstream, and averaging it in moved
well-reproduced outputs: on EfficientNet-Lite0 per tensor (equalized), judged
on calibration images held out of the correction, the mean over all positions
(AIMET's form) cut the logit MSE over the 1000 classes by a third but doubled
the squared error of each image's top-5 logits and raised the KL divergence
from the float softmax by half; the mean over M lowers all three
(docs/quantization.md). It is the bias that minimises the squared output error
over the unclipped positions.

Layers are corrected in order (``run_layerwise``), each measured with every
earlier correction in place, so corrections do not compound.
"""

from __future__ import annotations

import numpy as np
import torch

from ..ops.activation import apply_fused
from ..ops.registry import get_op
from .layerwise import float_data, run_layerwise, without_activation


def _channel_sum(t: torch.Tensor) -> torch.Tensor:
    """Per channel (dim 1) sum in float64, summed in float32 one image row at a time (no float64 copy)."""
    per_image = t.reshape(t.shape[0], t.shape[1], -1).sum(dim=2) if t.dim() > 2 else t
    return per_image.double().sum(dim=0)


def output_shift(node, pre_q: torch.Tensor, pre_f: torch.Tensor, chunk: int = 8) -> np.ndarray:
    """Per output channel: mean of ``pre_q - pre_f`` (pre-activations) over the positions where
    the float output is in the fused activation's linear part, 0 for a channel with none."""
    total = count = 0
    for i in range(0, pre_f.shape[0], chunk):  # a few images at a time: masks of all images would cost GBs
        f = pre_f[i:i + chunk]
        unclipped = (apply_fused(node, f) == f).to(f.dtype)
        total = total + _channel_sum((pre_q[i:i + chunk] - f) * unclipped)
        count = count + _channel_sum(unclipped)
    return (total / count.clamp(min=1)).numpy()


def has_bias(graph, node) -> bool:
    """Whether ``node`` has a constant, quantized bias (the ones bias correction can change)."""
    return (len(node.inputs) > 2 and bool(node.inputs[2]) and graph.values[node.inputs[2]].is_const
            and "bias" in node.quant)


def correct_layer_bias(graph, node, xs_q: list, pre_f: torch.Tensor) -> float:
    """Correct one layer's bias in place (float and int32) by its output shift on the quantized
    inputs ``xs_q`` (constants as the fake-quant run sees them) against the float
    pre-activation ``pre_f``. -> mean |shift|."""
    pre_q = get_op(node.op).forward(without_activation(node), xs_q)[0]
    shift = output_shift(node, pre_q, pre_f)
    bias = graph.values[node.inputs[2]]
    bias.float_data = float_data(bias)  # as AdaRound's weights: a later pass runs the float network
    bias.data = (bias.data.astype(np.float64) - shift.reshape(bias.data.shape)).astype(bias.data.dtype)
    graph.values[node.quant["bias"]].data = bias.quant.quantize(bias.data)
    return float(np.abs(shift).mean())


def correct_bias(graph, feeds: list[dict], compute_nodes: set, progress=None) -> dict:
    """Correct the biases of ``compute_nodes`` (names) of the quantized ``graph`` in
    place, from ``feeds`` (input batches, {name: array}): the float bias and its
    int32 constant. -> report {corrected, mean_abs_shift, without_bias}."""
    with_bias = {n.name for n in graph.nodes if n.name in compute_nodes and has_bias(graph, n)}
    shifts = []

    def visit(node, xs_f, xs_q, pre_f):
        shifts.append(correct_layer_bias(graph, node, xs_q, pre_f))

    run_layerwise(graph, feeds, with_bias, visit, progress)
    return {"corrected": len(shifts), "mean_abs_shift": float(np.mean(shifts)) if shifts else 0.0,
            "without_bias": sorted(compute_nodes - with_bias)}
