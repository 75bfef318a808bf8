"""Cross-layer equalization (Nagel et al., "Data-Free Quantization Through
Weight Equalization and Bias Correction", 2019).

For two layers in a row, ``y = W2 f(W1 x + b1) + b2`` with ``f`` positively
homogeneous per channel (``f(x / s) = f(x) / s`` for s > 0: identity, Relu,
LeakyRelu, a Clip whose bounds are divided by s too, and between the layers
max / average pooling and a channel-preserving Flatten), dividing channel i of
W1 and b1 by s_i and multiplying what W2 reads from channel i by s_i leaves y
unchanged. With ``s_i = sqrt(r1_i / r2_i)`` (r: the largest |weight| of the
channel on each side) both sides get the range ``sqrt(r1_i r2_i)``, so one
per-tensor weight scale fits every channel far better. This matters most for
depthwise layers, whose channel ranges span orders of magnitude.

ReLU6 (Clip(0, 6)) stays exact: its upper bound becomes 6 / s_i per channel,
which the fused Clip holds as a list and the integer simulator applies as
per-channel saturation.

The pairs of a chain (expand -> depthwise -> project) share a layer, so the
pairs are equalized in turn until the scales settle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import dtypes

# ops between the two layers that commute with a positive per-channel scale
_CHANNEL_PRESERVING = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Flatten")
_HOMOGENEOUS = ("", "Relu", "Clip", "LeakyRelu")


@dataclass
class Pair:
    first: object  # Node producing the channels
    second: object  # Node reading them
    between: list = field(default_factory=list)  # channel-preserving nodes in between


def _weights(graph, node) -> np.ndarray | None:
    if len(node.inputs) < 2 or not graph.values[node.inputs[1]].is_const:
        return None
    return graph.values[node.inputs[1]].data


def _out_channel_view(graph, node) -> np.ndarray | None:
    """First-layer weights as [C_out, -1] (a copy)."""
    w = _weights(graph, node)
    if w is None:
        return None
    if node.op == "Conv":
        return w.reshape(w.shape[0], -1)
    if node.op == "Gemm" and node.attrs["transA"] == 0:
        return w if node.attrs["transB"] else w.T  # [N, K]
    return None


def _in_channel_index(graph, node) -> np.ndarray | None:
    """For each weight element of the second layer, the input channel it reads."""
    w = _weights(graph, node)
    if w is None:
        return None
    if node.op == "Conv":
        g = node.attrs["group"]
        cout, cin_g = w.shape[0], w.shape[1]
        group = np.arange(cout) // (cout // g)
        idx = group[:, None] * cin_g + np.arange(cin_g)[None, :]
        return np.broadcast_to(idx.reshape(cout, cin_g, *[1] * (w.ndim - 2)), w.shape)
    if node.op == "Gemm" and node.attrs["transA"] == 0:
        k_axis = 1 if node.attrs["transB"] else 0
        shape = [1, 1]
        shape[k_axis] = -1
        return np.broadcast_to(np.arange(w.shape[k_axis]).reshape(shape), w.shape)
    return None


def _bias(graph, node):
    if len(node.inputs) > 2 and node.inputs[2] and graph.values[node.inputs[2]].is_const:
        return graph.values[node.inputs[2]]
    return None


def find_pairs(graph) -> tuple[list[Pair], list[tuple[str, str]]]:
    """-> (pairs to equalize, [(node, why not)] for compute nodes left out)."""
    consumers: dict[str, list] = {}
    for n in graph.nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)
    outputs = set(graph.outputs)
    pairs, skipped = [], []
    for node in graph.nodes:
        if node.op not in ("Conv", "Gemm") or _out_channel_view(graph, node) is None:
            continue
        if node.attrs["activation"] not in _HOMOGENEOUS:
            skipped.append((node.name, f"fused {node.attrs['activation']} is not positively homogeneous"))
            continue
        bias = _bias(graph, node)
        channels = _out_channel_view(graph, node).shape[0]
        if node.op == "Gemm" and bias is not None and bias.data.shape not in ((channels,), (1, channels)):
            skipped.append((node.name, "its C input is not one value per output channel"))
            continue
        if len(node.inputs) > 2 and node.inputs[2] and bias is None:
            continue
        between, value = [], node.outputs[0]
        while True:
            readers = consumers.get(value, [])
            if value in outputs or len(readers) != 1:
                reader = None
                break
            reader = readers[0]
            if reader.op in _CHANNEL_PRESERVING and reader.inputs[0] == value:
                if reader.op == "Flatten" and not _flatten_keeps_channels(graph, reader):
                    reader = None
                    break
                between.append(reader)
                value = reader.outputs[0]
                continue
            break
        if reader is None or reader.op not in ("Conv", "Gemm") or reader.inputs[0] != value:
            continue
        idx = _in_channel_index(graph, reader)
        if idx is None or int(idx.max()) + 1 != channels:
            continue
        if graph.values[node.inputs[1]].dtype not in dtypes.FLOAT_DTYPES:
            continue
        pairs.append(Pair(node, reader, between))
    return pairs, skipped


def _flatten_keeps_channels(graph, node) -> bool:
    shape = graph.values[node.inputs[0]].shape
    spatial = shape[2:]
    return node.attrs.get("axis", 1) == 1 and all(isinstance(d, int) and d == 1 for d in spatial)


def _scale_first(graph, node, s: np.ndarray) -> None:
    """Divide output channel i of ``node`` (weights, bias, fused Clip bounds) by s_i."""
    wv = graph.values[node.inputs[1]]
    if node.op == "Conv":
        wv.data = (wv.data / s.reshape([-1] + [1] * (wv.data.ndim - 1))).astype(wv.data.dtype)
    else:
        wv.data = (wv.data / (s[:, None] if node.attrs["transB"] else s[None, :])).astype(wv.data.dtype)
    bias = _bias(graph, node)
    if bias is not None:
        bias.data = (bias.data / s.reshape(bias.data.shape)).astype(bias.data.dtype)
    if node.attrs["activation"] == "Clip":
        lo, hi = (np.broadcast_to(np.asarray(p, np.float64), s.shape) / s for p in node.attrs["activation_params"])
        node.attrs["activation_params"] = [_bound_list(lo), _bound_list(hi)]


def _bound_list(b: np.ndarray):
    b = np.asarray(b, np.float32)
    return float(b[0]) if np.all(b == b[0]) else [float(v) for v in b]


def _scale_second(graph, node, s: np.ndarray, idx: np.ndarray) -> None:
    wv = graph.values[node.inputs[1]]
    wv.data = (wv.data * s[idx]).astype(wv.data.dtype)


def equalize(graph, iterations: int = 50, tolerance: float = 1e-4) -> dict:
    """Equalize every Conv/Gemm pair in place. -> report {pairs, iterations, skipped,
    coarse_channels_before, coarse_channels_after} (coarse: the share of the
    first layers' channels with less than 1/16 of their layer's weight range)."""
    pairs, skipped = find_pairs(graph)
    before = _coarse_share(graph, pairs)
    done = 0
    for done in range(1, iterations + 1):
        change = 0.0
        for p in pairs:
            r1 = np.abs(_out_channel_view(graph, p.first)).max(axis=1).astype(np.float64)
            idx = _in_channel_index(graph, p.second)
            r2 = np.zeros(r1.shape)
            np.maximum.at(r2, idx.reshape(-1), np.abs(_weights(graph, p.second)).reshape(-1).astype(np.float64))
            ok = (r1 > 0) & (r2 > 0)
            s = np.ones_like(r1)
            s[ok] = np.sqrt(r1[ok] / r2[ok])
            _scale_first(graph, p.first, s)
            _scale_second(graph, p.second, s, idx)
            change = max(change, float(np.abs(np.log(s)).max()))
        if change < tolerance:
            break
    return {"pairs": len(pairs), "iterations": done, "skipped": skipped,
            "coarse_channels_before": before, "coarse_channels_after": _coarse_share(graph, pairs)}


def _coarse_share(graph, pairs) -> float:
    """Share of the pairs' first-layer channels whose range is under 1/16 of their layer's
    largest: per-tensor int8 gives them fewer than 8 levels each side."""
    small = total = 0
    for p in pairs:
        r = np.abs(_out_channel_view(graph, p.first)).max(axis=1)
        small += int((r < r.max() / 16).sum())
        total += r.size
    return round(small / max(total, 1), 4)
