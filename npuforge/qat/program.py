"""The QAT model: a float IR whose forward is the integer program, with straight-through
gradients.

Each forward first decides the integers from the current float weights exactly as
``npuforge quantize`` does (:func:`~npuforge.quant.quantize.apply_parameters` on the
calibrated ranges: weight scales, int8 weights, int32 bias at input x weight scale,
requantization multipliers, tables, shared scales), then runs the graph node by node
twice over the same inputs:

* the integer simulator's kernel for the node (``IntegerSimulator.run_node``), on the codes:
  this gives the forward value, so the QAT model computes what the deployed program
  computes, bit for bit (rounding, saturation, fixed-point multipliers, tables);
* the op's float forward on the dequantized inputs, with the weights fake-quantized:
  this only carries the gradient (straight through the rounding; zero where the output
  saturates at the edge of its grid).

The value passed on is ``y_float + (dequantize(y_int) - y_float).detach()``. BatchNorm is
folded into the convolutions by the optimizer before any of this, with the model's own
epsilon, so its statistics are frozen from the start. Weight scales follow the weights.
Activation scales are those of the PTQ calibration, or with ``learn_scales`` learnt as in
LSQ (Esser et al., 2020): each sharing group's calibrated range times ``exp(t)``, ``t``
trained by LSQ's step: the gradient of a rounded value by its scale (``q - zp - x / s``
inside the grid, ``q - zp`` where it saturates) times ``1 / sqrt(elements x positive codes)``
is LSQ's for ``s``, and ``t`` moves by that step relative to ``s`` (its gradient is LSQ's
divided by ``s``, not the chain rule's ``s`` times it: with that, scales near 0.02 moved
by a millionth in a run).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import torch

from ..errors import NpuforgeError
from ..ops.registry import get_op
from ..quant.config import QuantConfig
from ..quant.quantize import apply_parameters, calibrated_plan, record
from ..sim.float_exec import check_feeds, execute, last_uses
from ..sim.integer import IntegerSimulator, quantize_input
from ..sim.lowered import make_simulator


START_STEPS = (("equalize", "equalize"), ("adaround", "AdaRound"), ("bias_correction", "bias correction"))


INSETS = (0.25, 0.3, 0.4, 0.45)  # steps inside a chosen code's interval, tried in turn (``place_at_codes``)


def within_codes(w: np.ndarray, codes: np.ndarray, wp, inset: float = 0.25) -> np.ndarray:
    """``w`` with every weight that does not round to its entry of ``codes`` (symmetric
    int8, scales ``wp``) moved ``inset`` steps inside that code's interval, on the side it
    came from; the others unchanged."""
    scale = np.asarray(wp.scale, np.float64)
    if scale.size > 1:
        shape = [1] * w.ndim
        shape[wp.axis] = -1
        scale = scale.reshape(shape)
    nearest, q = wp.quantize(w).astype(np.float64), codes.astype(np.float64)
    inside = (q - (0.5 - inset) * np.sign(q - nearest)) * scale
    return np.where(nearest == q, w, inside).astype(w.dtype)


def weight_codes(qgraph) -> dict:
    """{float weight name: its int8 codes} of a quantized graph."""
    return {n.inputs[1]: qgraph.values[n.quant["weight"]].data for n in qgraph.nodes if "weight" in n.quant}


def place_at_codes(start: dict, codes: dict, decide) -> dict:
    """Float weights that quantize to ``codes`` (AdaRound's choice): {name: (float weights,
    their scales)} -> {name: weights} by ``within_codes``, a quarter step inside first (the
    mean distance of the kept weights from their nearer boundary, so the float weights move
    least). ``decide({name: weights}) -> {name: stored codes}`` is the quantizer's decision;
    where a weight scale follows the moved weights (per tensor the clipping bound is chosen
    by squared error) a tensor's flipped weights go deeper, nearer the code (``INSETS``: less
    squared error at AdaRound's scale), until its decision is ``codes``; a tensor no inset
    reproduces keeps the deepest."""
    placed, pending = {}, list(start)
    for inset in INSETS:
        for name in pending:
            w, wp = start[name]
            placed[name] = within_codes(w, codes[name], wp, inset)
        stored = decide(placed)
        pending = [name for name in pending if not np.array_equal(stored[name], codes[name])]
        if not pending:
            break
    return placed


class _Scaled:
    """An observer whose range is the calibrated one times ``factor`` (a learnt scale)."""

    def __init__(self, base, factor: float):
        self.base, self.factor = base, factor

    def range(self, levels: int) -> tuple[float, float]:
        lo, hi = self.base.range(levels)
        return lo * self.factor, hi * self.factor

    def __getattr__(self, name):  # what else the quantizer reads (slice spreads): the calibration's
        return getattr(self.base, name)


class _LearntScale(torch.autograd.Function):
    """Forward: the exact value. Backward: as :class:`_StraightThrough` for the input, and
    LSQ's gradient for the scale ``s`` (a tensor whose value is the grid's scale)."""

    @staticmethod
    def forward(ctx, approx, exact, inside, codes, s, weight):
        ctx.save_for_backward(approx, inside, codes, s)
        ctx.weight = weight
        return exact

    @staticmethod
    def backward(ctx, grad):
        approx, inside, codes, s = ctx.saved_tensors
        by_scale = torch.where(inside, codes - approx / s.detach(), codes)
        return grad * inside, None, None, None, (grad * by_scale).sum().reshape(s.shape) * ctx.weight, None


class _StraightThrough(torch.autograd.Function):
    """Forward: the exact value. Backward: the float op's gradient, masked to zero where the
    integer output saturated (``inside`` False)."""

    @staticmethod
    def forward(ctx, approx, exact, inside):
        ctx.save_for_backward(inside)
        return exact

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None


def trainable_constants(graph, plan) -> list[str]:
    """The float weights and biases of the quantized compute nodes (Conv, Gemm, MatMul with
    a constant operand), in graph order: what QAT trains."""
    names = []
    for node in graph.nodes:
        if plan.kinds.get(node.name) != "compute":
            continue
        for name in node.inputs[1:3]:
            v = graph.values.get(name) if name else None
            if v is not None and v.is_const and np.asarray(v.data).dtype.kind == "f" and name not in names:
                names.append(name)
    return names


class QATProgram(torch.nn.Module):
    """``QATProgram(float_graph, calibration_batches, config)``; ``forward(x)`` -> the
    integer program's dequantized outputs (float32, with gradients); ``quantized()`` -> the
    quantized IR of the current weights; ``teacher(x)`` -> the float graph's outputs."""

    def __init__(self, graph, data, config: QuantConfig | dict | None = None, rounding: str = "fixedpoint",
                 log=None, progress=None, learn_scales: bool = False):
        super().__init__()
        config = config if isinstance(config, QuantConfig) else QuantConfig.from_dict(dict(config or {}))
        if config.ort_multipliers:  # (by default QAT keeps the multipliers it learnt with)
            raise NpuforgeError("QAT decides the requantization multipliers itself; drop --ort-multipliers")
        if len(graph.inputs) != 1:
            raise NpuforgeError(f"graph '{graph.name}' has {len(graph.inputs)} inputs; QAT takes one image input")
        self.reference = copy.deepcopy(graph)  # the float model, the distillation target
        self.template = copy.deepcopy(graph)  # the float graph QAT trains (equalized, bias-corrected)
        self.start = "PTQ" + "".join(f" + {label}" for k, label in START_STEPS if getattr(config, k))
        self.rounding = rounding
        self.log = log or (lambda message: None)
        if config.equalize:  # a starting point: the float function is unchanged, the weight ranges even
            from ..quant.equalize import equalize

            equalize(self.template)
        data = list(data) if config.bias_correction or config.adaround else data
        # the per-step decision: plain (round to nearest, from the current weights)
        self.config = replace(config, equalize=False, bias_correction=False, adaround=False, ort_multipliers=False)
        self.plan, self.observers, self.images, self.seconds = calibrated_plan(
            self.template, data, self.config, progress=progress, log=self.log)
        self.names = trainable_constants(self.template, self.plan)
        if not self.names:
            raise NpuforgeError(f"graph '{graph.name}' has no quantized Conv / Gemm / MatMul weights to train")
        start_codes = self._ptq_start(data, config) if config.bias_correction or config.adaround else {}
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.from_numpy(np.array(self.template.values[n].data, np.float32)))
             for n in self.names])
        # the sharing groups of activations whose scale is learnt: none of their members a
        # graph input or a constant (those keep the calibration's grid)
        plan = self.plan
        fixed = {plan.find(n) for n in set(self.template.inputs) | plan.constants}
        self.groups = sorted({plan.find(n) for n in plan.activations} - fixed) if learn_scales else []
        self.group_of = {g: k for k, g in enumerate(self.groups)}
        self.log_scales = torch.nn.Parameter(torch.zeros(len(self.groups)))  # exp(t): the range's factor
        self._cache = None  # (weight versions, quantized graph)
        self._engine = None  # (graph, its simulator for evaluation)
        if start_codes:
            self._report_rounding_kept(start_codes)

    def _ptq_start(self, data, config: QuantConfig) -> dict:
        """AdaRound and bias correction (as ``quantize --adaround --bias-correction``) on the
        PTQ program; QAT's initial weights and biases taken from it. -> {weight name: the
        program's int8 weights} where AdaRound chose them (else empty).

        Biases: the corrected float biases, copied. Weights: a weight that rounds to the
        code AdaRound chose keeps its float value; one AdaRound rounded the other way moves
        inside that code's interval, past the boundary it crossed (``place_at_codes``). So
        the first step rounds as AdaRound did, and the float weights stay where they were
        but for those flips."""
        from ..quant.adaround import adaround
        from ..quant.bias_correction import correct_bias
        from ..quant.calibrate import as_feeds

        graph = copy.deepcopy(self.template)
        apply_parameters(graph, self.plan, self.observers, self.config, lambda m: None)
        compute = {name for name, kind in self.plan.kinds.items() if kind == "compute"}
        feeds = [as_feeds(graph, batch) for batch in data]
        if config.adaround:
            self.log(f"AdaRound: learning the rounding of {len(compute)} layers' weights (minutes; "
                     + (f"cached in {config.adaround_cache})" if config.adaround_cache else "not cached)"))
            report = adaround(graph, feeds, compute, iterations=config.adaround_iters,
                              bias_correction=config.adaround_bias_correction,
                              cache_dir=config.adaround_cache or None)
            self.log(f"AdaRound rounded {100 * report['flipped_share']:.2f} % of the weights the other way than "
                     f"nearest ({report['reused']} of {report['layers']} layers from the cache)")
        if config.bias_correction:
            correct_bias(graph, feeds, compute)
        codes, start = {}, {}  # weight name -> AdaRound's codes; -> (float weights, their scales)
        for node in graph.nodes:
            if node.name not in compute:
                continue
            if len(node.inputs) > 2 and node.inputs[2]:
                self.template.values[node.inputs[2]].data = np.array(graph.values[node.inputs[2]].data, np.float32)
            if config.adaround:
                codes[node.inputs[1]] = graph.values[node.quant["weight"]].data
                start[node.inputs[1]] = (self.template.values[node.inputs[1]].data, graph.values[node.inputs[1]].quant)
        if codes:
            for name, w in place_at_codes(start, codes, self._decide).items():
                self.template.values[name].data = w
        return codes

    def _decide(self, weights: dict) -> dict:
        """{weight name: int8 codes} that ``quantize`` stores for the template with ``weights``."""
        memo = {id(self.template.values[name].data): w for name, w in weights.items()}
        graph = copy.deepcopy(self.template, memo)
        apply_parameters(graph, self.plan, self.observers, self.config, lambda m: None)
        return weight_codes(graph)

    def _report_rounding_kept(self, start_codes: dict) -> None:
        """Log how many of AdaRound's weight codes the first step's decision reproduces (a
        weight scale follows the weights, so the moved weights may shift it)."""
        graph = self.quantized()
        stored = weight_codes(graph)
        same = sum(int(np.count_nonzero(stored[name] == codes)) for name, codes in start_codes.items())
        total = sum(codes.size for codes in start_codes.values())
        self.log(f"the trained weights start with {same} of AdaRound's {total} weight codes"
                 + ("" if same == total else " (the rest where a weight scale moved with the flipped weights)"))

    # -- the integers of the current weights ----------------------------------------------
    def quantized(self, log=None):
        """The quantized IR of the current weights: the float graph with them, quantized with
        the calibrated ranges as ``npuforge quantize`` would (the same integers decision).
        Cached until a weight changes."""
        versions = tuple(w._version for w in self.weights) + (self.log_scales._version,)
        if self._cache is not None and self._cache[0] == versions and log is None:
            return self._cache[1]
        memo = {id(self.template.values[n].data): w.detach().cpu().numpy().copy()
                for n, w in zip(self.names, self.weights)}
        graph = copy.deepcopy(self.template, memo)
        observers = self.observers
        if self.groups:
            factors = torch.exp(self.log_scales.detach()).tolist()
            observers = {n: _Scaled(o, factors[self.group_of[self.plan.find(n)]])
                         if self.plan.find(n) in self.group_of else o for n, o in observers.items()}
        wide = apply_parameters(graph, self.plan, observers, self.config, log or (lambda m: None))
        record(graph, self.config, self.plan, self.images, wide, {})
        self._cache = (versions, graph)
        return graph

    @torch.no_grad()
    def teacher(self, x: torch.Tensor) -> torch.Tensor:
        """The float model's output (the original weights), the distillation target."""
        g = self.reference
        return torch.from_numpy(execute(g, {g.inputs[0]: x.numpy()})[g.outputs[0]])

    # -- the forward ----------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        graph = self.quantized()
        if not torch.is_grad_enabled():  # evaluation: the integer program alone, on the fast engine
            if self._engine is None or self._engine[0] is not graph:
                self._engine = (graph, make_simulator(graph, self.rounding))
            return torch.from_numpy(self._engine[1].run({graph.inputs[0]: x.detach().cpu().numpy()})[graph.outputs[0]])
        sim = IntegerSimulator(graph, self.rounding)
        values = graph.values
        trained = dict(zip(self.names, self.weights))
        codes_of = {n.inputs[k]: n.quant[role] for n in graph.nodes  # a trained weight -> its stored codes
                    for k, role in ((1, "weight"), (2, "bias")) if role in n.quant and n.inputs[k] in trained}
        name = graph.inputs[0]
        p = values[name].quant
        feed = check_feeds(graph, {name: x.detach().cpu().numpy()})[name]
        codes = torch.from_numpy(quantize_input(feed.numpy(), p))
        ints = {name: codes}
        floats = {name: p.dequantize_torch(codes)}
        last_use, keep = last_uses(graph), set(graph.outputs)
        factors = torch.exp(self.log_scales)  # exp(t) / exp(t).detach(): value 1, gradient d/dt
        factors = factors / factors.detach()

        def operand(value_name):
            if not value_name:
                return None
            if value_name in floats:
                return floats[value_name]
            v = values[value_name]
            data = torch.from_numpy(np.array(v.data))
            if value_name in trained:  # the stored codes, dequantized; straight through
                w = trained[value_name]
                grid = torch.from_numpy(v.quant.dequantize(values[codes_of[value_name]].data))
                return w + (grid - w).detach()
            if v.quant is not None and data.dtype.is_floating_point:
                return torch.from_numpy(v.quant.dequantize(v.quant.quantize(v.data)))
            return data

        for index, node in enumerate(graph.nodes):
            with torch.no_grad():
                exact = sim.run_node(node, ints)
            approx = get_op(node.op).forward(node, [operand(i) for i in node.inputs])
            for out, yi, yf in zip(node.outputs, exact, approx):
                if not out:
                    continue
                ints[out] = yi
                q = values[out].quant
                if not yi.dtype.is_floating_point and q is not None:
                    inside = (yi > q.qmin) & (yi < q.qmax)  # no gradient where it saturates
                    group = self.group_of.get(self.plan.find(out))
                    if group is None:
                        floats[out] = _StraightThrough.apply(yf, q.dequantize_torch(yi), inside)
                    else:
                        codes = yi.to(torch.float32) - float(q.zero_point)
                        # LSQ's step on s, taken on t = log s: dL/dt = s dL/ds, so 1 / s^2 more
                        positive = max(q.qmax - int(q.zero_point), 1)
                        weight = 1.0 / (np.sqrt(yi[0].numel() * positive) * float(q.scale) ** 2)
                        s = float(q.scale) * factors[group]
                        floats[out] = _LearntScale.apply(yf, q.dequantize_torch(yi), inside, codes, s, weight)
                elif yi.dtype.is_floating_point and yf.dtype.is_floating_point:
                    floats[out] = yf + (yi - yf).detach()
                else:
                    floats[out] = yi  # integer shape arithmetic
            for used in set(node.inputs):
                if used and last_use.get(used) == index and used not in keep:
                    ints.pop(used, None)
                    floats.pop(used, None)
        return floats[graph.outputs[0]]
