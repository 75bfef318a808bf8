"""AdaRound (Nagel et al., "Up or Down? Adaptive Rounding for Post-Training
Quantization", 2020): learn, layer by layer, whether each weight rounds up or
down so that the layer's output on calibration data stays closest to the
float layer's.

Per Conv / Gemm with weight scale s: ``W~ = s * clamp(floor(W / s) + h(V))``
with ``h(V) = clamp(sigmoid(V) * 1.2 - 0.1, 0, 1)``, V initialised so that
``h(V) = frac(W / s)`` (plain rounding's starting point). Adam minimises

    || f(W x + b) - f(W~ x~ + b) ||^2 + lambda * sum(1 - |2 h(V) - 1|^beta)

(f the fused activation, x the float network's input to the layer, x~ the
quantized network's, with every earlier layer already rounded), beta annealed
from 20 to 2 after a 20 % warm-up, so h(V) settles at 0 or 1. Each iteration
reads a random crop of a few random calibration images, which keeps it CPU
friendly; the iteration count is the budget. The defaults (8 images, 64x64
crops, Adam lr 0.03) come from a per-layer comparison on Lite0 per-tensor
(``benchmarks/adaround_layers.py``, docs/benchmarks.md): 200 steps of them cut
the layer's output error by 6-36 % below nearest rounding, as much as 600
steps on 4 images, 32x32 crops, lr 0.01, except on the first depthwise layer
(15 % against 60 %). The chosen weights are written as grid values (the
float weights then hold exactly the dequantized int8 weights, since every
engine quantizes them) together with their int8 constant; the float weights are
kept beside them in memory (``value.float_data``, see ``layerwise.float_data``)
so that the bias correction run after AdaRound compares with the float network,
not with one whose weights are already rounded.

Bias correction inside the pass (``bias_correction=True``, the default): right
after a layer's rounding is learnt, its bias (float and int32) is corrected per
output channel by the mean difference between the float layer's pre-activation
(float weights, float input) and the rounded one (learnt weights, int32 bias,
the quantized network's input), over the positions where the float output is in
the activation's linear part (``bias_correction.correct_layer_bias``, what the
separate pass does), so every later layer learns its rounding on corrected
inputs. Judged on held-out calibration images of Lite0 (learn on 0-79, KL
divergence of the softmax from float on 80-99 and their mirror images): per
tensor (equalized) 0.0049 against 0.0080 without it, per channel 0.00171 both
(logit MSE 0.0043 against 0.0048, top-1 agreement 40/40 against 38/40;
docs/quantization.md). Measured again afterwards without correcting, every
layer's shift is under one int32 step (Lite0 per tensor: all 50 layers). A
bias-correction pass after AdaRound still moves the biases a little, since each
sub-step correction it makes moves the later layers' inputs (Lite0 per tensor:
mean |shift| 0.0096 against 0.055 after AdaRound without the in-pass
correction). The float biases are kept beside the corrected ones
(``float_data``) as the weights are.

Resumable: with a cache folder, each layer's rounding is saved once learnt,
keyed by the layer's weights, scale, input statistics and the options (the bias
correction's included; the bias is corrected again from the cached rounding),
and a rerun reuses what matches.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from ..ops.activation import apply_fused
from ..ops.registry import get_op
from .bias_correction import correct_layer_bias, has_bias
from .layerwise import const_tensor, float_data, run_layerwise, without_activation

ZETA, GAMMA = 1.1, -0.1
DEFAULT_ITERATIONS = 300


def _h(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0, 1)


def _init_v(frac: torch.Tensor) -> torch.Tensor:
    frac = frac.clamp(0.01, 0.99)
    return -torch.log((ZETA - GAMMA) / (frac - GAMMA) - 1)


def _scale_shape(w: np.ndarray, wp) -> torch.Tensor:
    """The weight scale shaped to broadcast over the weight (per tensor or along its axis)."""
    s = torch.from_numpy(np.asarray(wp.scale, np.float32))
    if s.numel() == 1:
        return s.reshape(())
    shape = [1] * w.ndim
    shape[wp.axis] = -1
    return s.reshape(shape)


def _crop(node, xs: torch.Tensor, rng: np.random.Generator, size: int) -> tuple[slice, ...]:
    """A random spatial window of a Conv input (the whole tensor for a Gemm)."""
    if node.op != "Conv" or xs.dim() < 3:
        return (slice(None),) * xs.dim()
    window = []
    for d in xs.shape[2:]:
        n = min(d, size)
        start = int(rng.integers(0, d - n + 1))
        window.append(slice(start, start + n))
    return (slice(None), slice(None), *window)


def _cache_key(node, w: np.ndarray, scale, x_q: torch.Tensor, options: dict) -> str:
    h = hashlib.sha256()
    h.update(node.name.encode())
    h.update(np.ascontiguousarray(w).tobytes())
    h.update(np.ascontiguousarray(scale, np.float32).tobytes())
    std, mean = torch.std_mean(x_q)  # in float32: a float64 copy of all images' inputs would cost GBs
    h.update(np.float32([mean, std]).tobytes())
    h.update(repr(sorted(options.items())).encode())
    return h.hexdigest()[:24]


def adaround(graph, feeds: list[dict], compute_nodes: set, *, iterations: int = DEFAULT_ITERATIONS,
             images_per_step: int = 8, crop: int = 64, reg: float = 0.01, lr: float = 3e-2, seed: int = 0,
             bias_correction: bool = True, cache_dir: str | None = None, progress=None) -> dict:
    """Learn the rounding of every quantized Conv / Gemm weight in ``compute_nodes``, in
    place; with ``bias_correction``, correct each layer's bias right after its rounding is
    learnt (module docstring). -> report {layers, iterations, flipped_share (share of
    weights rounded the other way than nearest), reused (layers taken from the cache),
    biases_corrected}."""
    options = {"iterations": iterations, "images": images_per_step, "crop": crop, "reg": reg, "lr": lr,
               "seed": seed, "bias_correction": bias_correction}
    cache = Path(cache_dir) if cache_dir else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    targets = {n.name for n in graph.nodes if n.name in compute_nodes and "weight" in n.quant}
    stats = {"layers": 0, "reused": 0, "flipped": 0, "weights": 0, "biases": 0}

    def visit(node, xs_f, xs_q, pre_f):
        wv = graph.values[node.inputs[1]]
        wp = wv.quant
        w = float_data(wv).astype(np.float32)
        key = _cache_key(node, w, wp.scale, xs_q[0], options) if cache is not None else None
        path = cache / f"{key}.npy" if cache is not None else None
        nearest = wp.quantize(w)
        if path is not None and path.is_file():
            q = np.load(path)
            stats["reused"] += 1
        else:
            threads = torch.get_num_threads()
            # small crops: thread start-up costs more than it saves (measured 2-10x slower on 2 threads)
            torch.set_num_threads(1)
            try:
                with torch.enable_grad():  # run_layerwise runs under no_grad
                    q = _learn(node, w, wp, xs_f, xs_q, seed, options).astype(nearest.dtype)
            finally:
                torch.set_num_threads(threads)
            if path is not None:
                np.save(path, q)
        stats["layers"] += 1
        stats["flipped"] += int((q != nearest).sum())
        stats["weights"] += q.size
        wv.float_data = float_data(wv)  # the float network of a later pass (bias correction) needs these
        wv.data = wp.dequantize(q).astype(wv.data.dtype)
        graph.values[node.quant["weight"]].data = q
        if bias_correction and has_bias(graph, node):  # measured with the learnt weights and the int32 bias
            bias = graph.values[node.inputs[2]]
            correct_layer_bias(graph, node, [xs_q[0], const_tensor(wv, True), const_tensor(bias, True),
                                             *xs_q[3:]], pre_f)
            stats["biases"] += 1

    run_layerwise(graph, feeds, targets, visit, progress)
    return {"layers": stats["layers"], "iterations": iterations, "reused": stats["reused"],
            "flipped_share": round(stats["flipped"] / max(stats["weights"], 1), 4),
            "biases_corrected": stats["biases"]}


def _learn(node, w: np.ndarray, wp, xs_f: list, xs_q: list, seed: int, options: dict) -> np.ndarray:
    op = get_op(node.op)
    linear = without_activation(node)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    s = _scale_shape(w, wp)
    wt = torch.from_numpy(w)
    floor = torch.floor(wt / s)
    v = _init_v(wt / s - floor).requires_grad_(True)
    opt = torch.optim.Adam([v], lr=options["lr"])
    lo, hi = wp.qmin, wp.qmax
    iterations = options["iterations"]
    warmup = int(0.2 * iterations)
    n = xs_f[0].shape[0]
    for it in range(iterations):
        pick = torch.from_numpy(rng.choice(n, size=min(options["images"], n), replace=False))
        window = _crop(node, xs_f[0], rng, options["crop"])
        x_f, x_q = xs_f[0][pick][window], xs_q[0][pick][window]
        with torch.no_grad():
            target = apply_fused(node, op.forward(linear, [x_f, *xs_f[1:]])[0])
        w_soft = torch.clamp(floor + _h(v), lo, hi) * s
        out = apply_fused(node, op.forward(linear, [x_q, w_soft, *xs_q[2:]])[0])
        rec = (out - target).pow(2).sum(dim=1).mean()
        if it < warmup:
            loss = rec
        else:
            beta = 20 - (20 - 2) * (it - warmup) / max(iterations - warmup - 1, 1)
            loss = rec + options["reg"] * (1 - (2 * _h(v) - 1).abs().pow(beta)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        q = torch.clamp(floor + (_h(v) >= 0.5).float(), lo, hi)
    return q.numpy()
