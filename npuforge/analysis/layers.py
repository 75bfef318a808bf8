"""Per-layer error of a quantized graph against its float self, in two views.

* cumulative: the quantized network as it runs (fake-quant); each layer's output
  against the float network's.
* isolated: only that layer quantized (its int8 inputs, weights and output; every
  other layer float), measured at the layer's output and at the network output.

The network-output error of each isolated layer is its sensitivity: quantization
noise from different layers roughly adds up at the output, so each layer's share
of the summed output noise says how much of the total damage it explains.

Layer outputs: the float and the fake-quant networks run in lockstep over chunks
of images, node by node, so only live values are held. Network outputs of the
isolated layers: ONNX Runtime runs one QDQ model per layer (all parameters but that
layer's stripped), several times faster than re-running npuforge's executor, and
each from that layer on: the float values it starts from come from one float run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..ir.subgraph import live_values, suffix, values_bytes, with_outputs
from ..ops.registry import get_op
from ..sim.float_exec import check_feeds, last_uses
from .metrics import ErrorStats, weight_stats

ANALYSED_KINDS = ("compute", "matmul", "elementwise", "pool", "lut")
PREFIX_BUDGET = 1 << 30  # bytes of float values kept to start the isolated runs mid-network


@dataclass
class Layer:
    depth: int  # position among the analysed layers, in graph order
    node: str
    op: str
    kind: str
    output: str
    cumulative: ErrorStats = field(default_factory=ErrorStats)
    isolated: ErrorStats = field(default_factory=ErrorStats)
    to_output: ErrorStats = field(default_factory=ErrorStats)  # network output, only this layer quantized
    variants: dict = field(default_factory=dict)  # label -> isolated layer-output ErrorStats with other params
    weights: dict | None = None
    share: float = 0.0  # of the summed isolated network-output noise
    rank: int = 0


def layers_of(qgraph) -> list[Layer]:
    """The quantized nodes that compute something (passthrough and concat nodes only move codes)."""
    out = []
    for node in qgraph.nodes:
        kind = get_op(node.op).quant_kind(node, qgraph)
        if kind not in ANALYSED_KINDS or not node.outputs or qgraph.values[node.outputs[0]].quant is None:
            continue
        layer = Layer(len(out), node.name, node.op, kind, node.outputs[0])
        if kind == "compute":
            w = qgraph.values[node.inputs[1]]
            axis = get_op(node.op).weight_axis(node, qgraph)
            if axis is not None and w.data is not None:
                layer.weights = weight_stats(w.data, axis)
        out.append(layer)
    return out


def fake_quant(p, t: torch.Tensor) -> torch.Tensor:
    """``p.fake_quant(t)``; per tensor through torch's fused kernel (one pass instead of five,
    2-3x faster). It multiplies by 1/scale where npuforge divides by scale, so an exact tie
    can round the other way: a few elements in a million, nothing a per-layer metric sees."""
    if p.axis is None and p.scale.ndim == 0:
        return torch.fake_quantize_per_tensor_affine(t, float(p.scale), int(p.zero_point), p.qmin, p.qmax)
    return p.fake_quant(t)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True, order="C"))


class LayerProbe:
    def __init__(self, qgraph):
        self.g = qgraph
        self.layers = layers_of(qgraph)
        self.by_node = {layer.node: layer for layer in self.layers}
        self.nodes = list(qgraph.nodes)
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        consts = qgraph.constants()
        self.fconst = {v.name: _tensor(v.data) for v in consts}
        self.qconst = {v.name: torch.from_numpy(v.quant.dequantize(v.quant.quantize(v.data)))
                       for v in consts if v.quant is not None}
        self.qact = {n: v.quant for n, v in qgraph.values.items() if v.quant is not None and not v.is_const}
        self.output_stats = ErrorStats()  # the whole quantized network's output

    @staticmethod
    def _forward(node, xs):
        return get_op(node.op).forward(node, xs)

    def _quantized_inputs(self, node, env: dict) -> list:
        """The node's inputs as its int8 version reads them, from float values."""
        xs = []
        for name in node.inputs:
            if not name:
                xs.append(None)
            elif name in self.qconst:
                xs.append(self.qconst[name])
            elif name in self.qact:
                xs.append(fake_quant(self.qact[name], env[name]))
            else:
                xs.append(env[name])
        return xs

    def run(self, x: np.ndarray, chunk: int = 8, variants: dict | None = None, errors: bool = True,
            progress=None) -> None:
        """Accumulate the cumulative and isolated layer-output errors over images ``x``
        (float32 NCHW): the float and fake-quant networks run in lockstep, node by node,
        each freeing what it no longer needs. ``variants``: {node: {label: QParams}}, other
        output parameters (int16, another observer) whose isolated layer-output error is
        measured too (``Layer.variants``). ``errors=False``: only the variants (the float
        network alone runs)."""
        variants = variants or {}
        last = last_uses(self.g)
        keep = set(self.g.outputs)
        with torch.no_grad():
            for start in range(0, len(x), chunk):
                xb = x[start:start + chunk]
                env = check_feeds(self.g, {self.g.inputs[0]: xb})
                q = {n: fake_quant(self.qact[n], t) if n in self.qact else t for n, t in env.items()}
                env.update(self.fconst)
                q.update(self.fconst)
                q.update(self.qconst)
                for i, node in enumerate(self.nodes):
                    ys = self._forward(node, [env[n] if n else None for n in node.inputs])
                    qs = self._forward(node, [q[n] if n else None for n in node.inputs]) if errors else ys
                    layer = self.by_node.get(node.name)
                    todo = variants.get(node.name, {})
                    if layer is not None and (errors or todo):
                        iso = self._forward(node, self._quantized_inputs(node, env))[0]
                        if errors:
                            layer.isolated.update(ys[0], fake_quant(self.qact[layer.output], iso))
                        for label, p in todo.items():
                            layer.variants.setdefault(label, ErrorStats()).update(ys[0], fake_quant(p, iso))
                    for name, y, yq in zip(node.outputs, ys, qs):
                        if errors and name in self.qact:
                            yq = fake_quant(self.qact[name], yq)
                        env[name], q[name] = y, yq
                        if errors and layer is not None and name == layer.output:
                            layer.cumulative.update(y, yq)
                    for name in set(node.inputs):
                        if name and last.get(name) == i and name not in keep and name not in self.fconst:
                            del env[name], q[name]
                if errors:
                    for name in self.g.outputs:
                        self.output_stats.update(env[name], q[name])
                if progress is not None:
                    progress(min(start + chunk, len(x)))

    def isolated_graph(self, node_name: str, output_params=None):
        """A context: the graph with only ``node_name`` quantized (its quantized inputs,
        constants and output; the output with ``output_params`` when given; None as
        output_params keeps the output in float)."""
        return _Isolated(self, node_name, output_params)

    def output_errors(self, x: np.ndarray, float_logits: np.ndarray, runs: dict, batch_size: int = 50,
                      progress=None, budget: int = PREFIX_BUDGET) -> dict:
        """Network-output error of isolated layers: ``runs`` maps a key to (node name, output
        params or "same") -> {key: ErrorStats}. ONNX Runtime runs each one-layer QDQ model from
        that layer on: everything before it is the float network, whose values one float run
        gives them all (when they fit in ``budget`` bytes; else each runs whole)."""
        from .session import ort_logits

        starts = {key: self.index[node_name] for key, (node_name, _) in runs.items()}
        before = self._float_values(x, sorted(set(starts.values())), batch_size, budget)
        out = {}
        for done, (key, (node_name, params)) in enumerate(runs.items(), 1):
            with self.isolated_graph(node_name, params) as g:  # one QDQ layer: the float kernels' speed matters
                if before is None:
                    logits = ort_logits(g, x, batch_size, optimized=True)
                else:
                    rest = suffix(g, starts[key])
                    logits = ort_logits(rest, {n: before[n] for n in rest.inputs}, batch_size, optimized=True)
            stats = ErrorStats()
            stats.update(torch.from_numpy(float_logits), torch.from_numpy(logits))
            out[key] = stats
            if progress is not None:
                progress(done)
        return out

    def _float_values(self, x: np.ndarray, starts: list, batch_size: int, budget: int) -> dict | None:
        """{value: array over ``x``}: every value the float network computes before one of the
        nodes ``starts`` and reads from it on; None when they would take more than ``budget``
        bytes (or a shape is not known)."""
        from .session import ort_outputs

        names = sorted({n for i in starts if i > 0 for n in live_values(self.g, i)} - set(self.g.inputs))
        size = values_bytes(self.g, names, len(x), 4)
        if size is None or size > budget:
            return None
        with self.isolated_graph(None, None) as g:
            g_all = with_outputs(g, names)
            values = ort_outputs(g_all, x, names, batch_size) if names else {}
        return {**values, self.g.inputs[0]: x}

    def rank(self) -> list[Layer]:
        """Layers by their isolated network-output noise, largest first; ``share`` of the sum."""
        total = sum(layer.to_output.noise for layer in self.layers)
        for layer in self.layers:
            layer.share = layer.to_output.noise / total if total > 0 else 0.0
        ranked = sorted(self.layers, key=lambda layer: -layer.to_output.noise)
        for r, layer in enumerate(ranked, 1):
            layer.rank = r
        return ranked


class _Isolated:
    """Temporarily strips every quantization parameter but one layer's (restored on exit)."""

    def __init__(self, probe: LayerProbe, node_name: str, output_params):
        self.g = probe.g
        if node_name is None:  # the float network
            self.keep, self.output, self.output_params = set(), None, None
            return
        node = probe.nodes[probe.index[node_name]]
        self.keep = {n for n in node.inputs if n and self.g.values[n].quant is not None}
        self.output, self.output_params = node.outputs[0], output_params

    def __enter__(self):
        self.saved = {n: v.quant for n, v in self.g.values.items() if v.quant is not None}
        for n, v in self.g.values.items():
            if n not in self.keep:
                v.quant = None
        if self.output is not None:  # (None: the float network)
            self.g.values[self.output].quant = self.saved[self.output] if self.output_params == "same" \
                else self.output_params
        return self.g

    def __exit__(self, *exc):
        for n, v in self.g.values.items():
            v.quant = self.saved.get(n)
        return False
