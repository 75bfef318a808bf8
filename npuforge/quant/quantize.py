"""Post-training quantization of a graph: (equalize,) plan, calibrate, choose
parameters, decide the integers (, AdaRound, bias correction).

The result is the same graph with quantization parameters on its values
(``Value.quant``) and, per quantized node, the integer constants an NPU needs
(``Node.quant``: int8 weights, int32 bias, requantization multiplier and
shift, lookup tables). Float weights stay in the graph for analysis.

Parameter sharing (one set of parameters for several values) follows the ops'
rules: a "passthrough" op's output shares its input's parameters, a "concat"
op's inputs and output share one set. Add/Sub/Mul inputs keep their own
parameters and the integer op rescales each to the output's (the documented
policy). Shape arithmetic stays as it is.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import NpuforgeError
from ..ir import dtypes
from ..ops.registry import get_op
from .adaround import adaround
from .attention_mask import additive_masks, finite_masks
from .bias_correction import correct_bias
from .calibrate import as_feeds, calibrate
from .concat_ranges import mismatched_concats
from .config import QuantConfig
from .equalize import equalize
from .norm_spread import narrow_norms, slices_of
from .params import QParams, QRANGES, from_range, weight_params
from .ort_multipliers import match_multipliers
from .requant import (TFLITE_ADD_LEFT_SHIFT, activation_code_bounds, requant_multiplier, tflite_add_multipliers,
                      tflite_mean_multiplier, tflite_mul_multiplier, tflite_product_multiplier)
from .tflite_16x8 import ADD_LEFT_SHIFT_16, add_multipliers_16, multiplier_16x8, writable_groups
from .tflite_rewrites import decompose_for_tflite, split_fused_leaky_relu
from .tflite_softmax import widen_small_steps
from .tflite_tables import fixed_output, tflite_table



@dataclass
class Plan:
    kinds: dict = field(default_factory=dict)  # node name -> kind
    activations: set = field(default_factory=set)  # non-constant values to calibrate
    constants: set = field(default_factory=set)  # constant operands quantized from their data
    parent: dict = field(default_factory=dict)  # union-find over values sharing parameters
    kept_float: list = field(default_factory=list)  # (node, reason)
    copies: dict = field(default_factory=dict)  # a shared constant's copy -> the constant (unshare_constants)
    narrow_norms: list = field(default_factory=list)  # normalizations given an int16 input (apply_parameters)

    def find(self, v: str) -> str:
        while self.parent.get(v, v) != v:
            self.parent[v] = self.parent.get(self.parent[v], self.parent[v])
            v = self.parent[v]
        return v

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def _owns_rule(node) -> bool:
    """The op's class decides its integers (``quantize_integers``) and runs them
    (``integer_forward``): the kinds beyond the seven generic ones (softmax, layernorm)."""
    return hasattr(get_op(node.op), "quantize_integers")


def _is_float(graph, name: str) -> bool:
    return bool(name) and graph.values[name].dtype in dtypes.FLOAT_DTYPES


def unshare_constants(graph) -> dict:
    """Give every node its own copy of each float constant that several nodes read, in
    place; -> {copy: the constant it copies}. Parameters live on values, and one constant
    may play different parts (an all-zero array the exporter or ``cse`` merged is
    three Convs' biases, each with its own per-channel int32 scale, and an Add's
    operand): each reader then carries the parameters its own rule needs."""
    copies = {}
    readers: dict[str, list] = {}
    for node in graph.nodes:
        for name in dict.fromkeys(i for i in node.inputs if i):  # a node reading it twice keeps one
            readers.setdefault(name, []).append(node)
    for name, nodes in readers.items():
        v = graph.values[name]
        if not v.is_const or v.dtype not in dtypes.FLOAT_DTYPES or name in graph.outputs or len(nodes) < 2:
            continue
        for node in nodes[1:]:
            copy_name = graph.unique_name(f"{name}::{node.name}")
            graph.add_const(copy_name, v.data)
            node.inputs = [copy_name if i == name else i for i in node.inputs]
            copies[copy_name] = name
    return copies


def make_plan(graph, config: QuantConfig) -> Plan:
    """Each node's quantization kind and the values to calibrate and quantize (sharing
    groups by the ops' rules); shared float constants are unshared first."""
    plan = Plan(copies=unshare_constants(graph))
    keep = set(config.keep_float)
    for option, names in (("keep_float", keep), ("per_channel", set(config.per_channel))):
        unknown = names - {n.name for n in graph.nodes}
        if unknown:
            raise NpuforgeError(f"{option} names unknown node(s): {', '.join(sorted(unknown))}")
    for node in graph.nodes:
        kind = get_op(node.op).quant_kind(node, graph)
        if node.name in keep:
            plan.kept_float.append((node, "asked to keep in float"))
            continue
        if kind == "shape":
            continue
        if kind is None:
            if any(_is_float(graph, o) for o in node.outputs):
                plan.kept_float.append((node, getattr(get_op(node.op), "float_reason", "no quantization rule")))
            continue
        plan.kinds[node.name] = kind
        float_ins = [i for i in node.inputs if _is_float(graph, i)]
        if kind == "compute":
            float_ins = float_ins[:1]  # weight and bias are quantized by the node
        elif kind == "minmax":
            float_ins = [i for i in float_ins if not graph.values[i].is_const]  # constants: output codes
        elif kind == "divide":
            pass  # both operands: activations, or a constant on its own grid (quant/div_rule.py)
        elif kind in ("lut", "pool", "passthrough") or _owns_rule(node):
            float_ins = float_ins[:1]  # other float inputs are parameters (Clip bounds, pad value, scale)
        for name in float_ins:
            (plan.constants if graph.values[name].is_const else plan.activations).add(name)
        outs = [o for o in node.outputs if _is_float(graph, o)]
        plan.activations.update(outs)
        if float_ins and (kind in ("passthrough", "interpolate") or
                          (config.tflite_multipliers and node.op == "AveragePool")):
            # (TFLite's int8 AVERAGE_POOL_2D averages codes: its output keeps its input's grid)
            for o in outs:
                plan.union(float_ins[0], o)
        elif kind == "concat" or (kind == "minmax" and config.target == "tflite"):
            # (TFLite's MAXIMUM / MINIMUM compare codes: operands and output on one grid)
            for name in float_ins + outs:
                plan.union(float_ins[0], name)
    unasked = [(n, r) for n, r in plan.kept_float if r != "asked to keep in float"]
    if config.strict and unasked:
        node, reason = unasked[0]
        why = "" if reason == "no quantization rule" else f" ({reason})"
        raise NpuforgeError(f"node '{node.name}' ({node.op}) has no quantization rule{why} (strict mode); "
                            f"keep it in float with keep_float or drop --strict")
    return plan


def _fix_tflite_outputs(graph, plan: Plan) -> None:
    """The output grids TFLite requires (LOGISTIC 1/256, TANH 1/128, SOFTMAX 1/256), on every
    value of a sharing group whose values are outputs of one such op and of ops that only move
    codes (a Reshape or Concat after a Sigmoid shares its grid: looked through)."""
    producer = {o: n for n in graph.nodes for o in n.outputs}
    groups: dict[str, list[str]] = {}
    for name in plan.activations:
        groups.setdefault(plan.find(name), []).append(name)
    for names in groups.values():
        ops = {producer[n].op if n in producer else None for n in names
               if n not in producer or plan.kinds.get(producer[n].name) not in ("passthrough", "concat")}
        p = fixed_output(ops.pop(), graph.values[names[0]].quant.dtype) if len(ops) == 1 else None
        for n in names if p is not None else []:
            graph.values[n].quant = p


def _levels(dtype: str, symmetric: bool) -> int:
    lo, hi = QRANGES[dtype]
    return (hi - lo - 1) if symmetric and dtype != "uint8" else (hi - lo)


def _group_params(graph, plan: Plan, observers: dict, config: QuantConfig, int16: set) -> dict:
    """One QParams per sharing group, from the union of its members' ranges; a group
    with a member (or its producer) named in ``int16`` is quantized in int16."""
    producer = {o: n.name for n in graph.nodes for o in n.outputs}
    members: dict[str, list[str]] = {}
    for name in sorted(plan.activations | plan.constants):
        members.setdefault(plan.find(name), []).append(name)
    params = {}
    for root, names in members.items():
        wide = any(n in int16 or producer.get(n) in int16 for n in names)
        dtype = "int16" if wide else config.activation_dtype
        symmetric = config.symmetric or wide
        lo, hi = np.inf, -np.inf
        for n in names:
            v = graph.values[n]
            if v.is_const:
                a, b = float(v.data.min()), float(v.data.max())
            else:
                a, b = observers[n].range(_levels(dtype, symmetric))
            lo, hi = min(lo, a), max(hi, b)
        p = from_range(lo, hi, dtype, symmetric)
        for n in names:
            params[n] = p
    return params


# (weights' digest, dtype, shape, axis, qmax) -> the "mse" bound: the analysis's remedies and
# the recipe searches quantize one graph's weights many times, 71 roundings of each a time
_CLIPS: dict = {}
_CLIPS_KEPT = 4096


def _weight_clip(w: np.ndarray, axis: int | None, method: str, qmax: int) -> np.ndarray | None:
    """None for max |w|; for "mse" the clipping bound with the least squared rounding error."""
    if method != "mse":
        return None
    w = np.ascontiguousarray(w)
    key = (hashlib.blake2b(w.tobytes(), digest_size=16).digest(), w.dtype.str, w.shape, axis, qmax)
    if key not in _CLIPS:
        if len(_CLIPS) >= _CLIPS_KEPT:
            _CLIPS.clear()
        _CLIPS[key] = _mse_clip(w, axis, qmax)
    return copy.copy(_CLIPS[key])


def _mse_clip(w: np.ndarray, axis: int | None, qmax: int):
    wt = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1) if axis is not None else w.reshape(1, -1)
    peak = np.abs(wt).max(axis=1)
    best, best_err = peak.copy(), np.full(peak.shape, np.inf)
    for f in np.linspace(0.3, 1.0, 71):
        bound = np.maximum(peak * f, 1e-12)
        scale = (bound / qmax)[:, None]
        err = ((np.clip(np.rint(wt / scale), -qmax, qmax) * scale - wt) ** 2).sum(axis=1)
        better = err < best_err
        best[better], best_err[better] = bound[better], err[better]
    return best if axis is not None else best[0]


def _add_int(graph, node, role: str, data: np.ndarray) -> None:
    name = graph.unique_name(f"{node.name}::{role}")
    graph.add_const(name, data)
    node.quant[role] = name


def _requant(graph, node, role: str, m, config: QuantConfig) -> None:
    mult, shift = requant_multiplier(np.atleast_1d(np.asarray(m, np.float64)), config.tflite_multipliers)
    _add_int(graph, node, f"multiplier{role}", mult)
    _add_int(graph, node, f"shift{role}", shift)


BIAS_LIMIT = 2.0**30  # the largest |int32 bias code|: half of int32, the rest for the accumulation


def _bias_fitting_weights(graph, node, w, wp: QParams, axis, qmax: int, in_scale, widened: list) -> QParams:
    """``wp``, with each weight scale widened where the bias would not fit int32 at
    scale ``in_scale * weight scale`` (the bias code would saturate and the output lose
    its bias, silently); ``(node, channels, largest factor)`` goes to ``widened``."""
    bias = np.abs(np.asarray(graph.values[node.inputs[2]].data, np.float64)).reshape(-1)
    need = bias / (in_scale * BIAS_LIMIT)  # the smallest weight scale that holds each bias
    if axis is None:
        need = need.max(initial=0.0)
    scale = wp.scale.astype(np.float64)
    if not np.any(need > scale):
        return wp
    wider = weight_params(w, axis, qmax, np.maximum(scale, need * (1 + 2.0**-20)) * qmax)
    widened.append((node.name, int(np.count_nonzero(need > scale)),
                    float(np.max(wider.scale.astype(np.float64) / scale))))
    return wider


def _report_widened(widened: list, log) -> None:
    if not widened:
        return
    names = ", ".join(f"'{n}'" for n, _, _ in widened[:3]) + (", ..." if len(widened) > 3 else "")
    log(f"{sum(c for _, c, _ in widened)} output channel(s) in {len(widened)} node(s) ({names}) have a bias that "
        f"does not fit int32 at the input's scale times the weight scale (near-zero weights, as a dead channel's, "
        f"or a tiny input range); their weight scales are widened, up to {max(f for _, _, f in widened):.3g}x, "
        f"so it does")


def _quantize_compute(graph, node, config: QuantConfig, widened: list) -> None:
    op = get_op(node.op)
    x, w = graph.values[node.inputs[0]], graph.values[node.inputs[1]]
    y = graph.values[node.outputs[0]]
    per_channel = config.granularity == "per-channel" or node.name in config.per_channel
    axis = op.weight_axis(node, graph) if per_channel else None
    qmax = 63 if config.reduce_range else 127
    # auto weight clipping: minmax for per-channel scales (also a per_channel override), mse per tensor
    method = "minmax" if per_channel and config.weight_method == "auto" else config.resolved_weight_method
    wp = weight_params(w.data, axis, qmax, _weight_clip(w.data, axis, method, qmax))
    in_scale, out_scale = np.float64(x.quant.scale), np.float64(y.quant.scale)
    if len(node.inputs) > 2 and node.inputs[2]:
        wp = _bias_fitting_weights(graph, node, w.data, wp, axis, qmax, in_scale, widened)
    w.quant = wp
    _add_int(graph, node, "weight", wp.quantize(w.data))
    bias_scale = (in_scale * wp.scale.astype(np.float64)).astype(np.float32)
    if len(node.inputs) > 2 and node.inputs[2]:
        b = graph.values[node.inputs[2]]
        b.quant = QParams("int32", bias_scale, np.zeros(bias_scale.shape, np.int32), 0 if axis is not None else None)
        _add_int(graph, node, "bias", b.quant.quantize(b.data))
    real = in_scale * wp.scale.astype(np.float64) / out_scale
    if config.target == "tflite" and y.quant.dtype == "int16":  # LiteRT's 16x8 requantization, rounding once
        mult, shift = multiplier_16x8(real)
        _add_int(graph, node, "multiplier", mult)
        _add_int(graph, node, "shift", shift)
        _add_int(graph, node, "single_rounding", np.asarray(1, np.int32))
    else:
        _requant(graph, node, "", real, config)
        if config.tflite_multipliers and node.op in ("Gemm", "MatMul"):  # TFLite's FULLY_CONNECTED rounds once
            _add_int(graph, node, "single_rounding", np.asarray(1, np.int32))
    if node.attrs.get("activation") in ("Relu", "Clip") and not y.quant.per_channel:
        lo, hi = activation_code_bounds(node, y.quant)  # a fused Relu / Clip is saturation in the output's codes
        _add_int(graph, node, "act_min", np.asarray(lo, np.int32))
        _add_int(graph, node, "act_max", np.asarray(hi, np.int32))


def _lut(graph, node, config: QuantConfig) -> None:
    """Table over every input code: dequantize -> the op's float forward -> quantize (or,
    with TFLite's arithmetic, TFLite's integer kernel where it differs: quant/tflite_tables.py)."""
    xp, yp = graph.values[node.inputs[0]].quant, graph.values[node.outputs[0]].quant
    table = tflite_table(graph, node, xp, yp) if config.tflite_multipliers else None
    if table is not None:
        _add_int(graph, node, "lut", table.astype(yp.dtype))
        return
    codes = np.arange(xp.qmin, xp.qmax + 1)
    x = torch.from_numpy(xp.dequantize(codes))
    extra = [None if not i else torch.from_numpy(np.array(graph.values[i].data)) for i in node.inputs[1:]]
    with torch.no_grad():
        y = get_op(node.op).forward(node, [x, *extra])[0].numpy()
    _add_int(graph, node, "lut", yp.quantize(y))


def _mean_count(graph, node) -> int | None:
    """The element count of a global mean (GlobalAveragePool, ReduceMean) of static shape, else None."""
    shape = graph.values[node.inputs[0]].shape
    if node.op == "GlobalAveragePool":
        dims = list(shape[2:])
    elif node.op == "ReduceMean" and len(node.inputs) > 1 and node.inputs[1]:
        axes = np.asarray(graph.values[node.inputs[1]].data).reshape(-1)
        dims = [shape[int(a) % len(shape)] for a in axes]
    else:
        return None
    return int(np.prod(dims)) if dims and all(isinstance(d, int) for d in dims) else None


def _quantize_node(graph, node, kind: str, config: QuantConfig, widened: list) -> None:
    ins = [graph.values[i].quant if i else None for i in node.inputs]
    out = graph.values[node.outputs[0]].quant
    if kind == "compute":
        _quantize_compute(graph, node, config, widened)
    elif kind == "matmul":
        _requant(graph, node, "", tflite_product_multiplier(ins[0].scale, ins[1].scale, out.scale)
                 if config.tflite_multipliers else
                 np.float64(ins[0].scale) * np.float64(ins[1].scale) / np.float64(out.scale), config)
    elif kind == "elementwise":
        for k, name in enumerate(node.inputs):
            v = graph.values[name]
            if v.is_const:
                _add_int(graph, node, f"input{k}", v.quant.quantize(v.data))
        if node.op == "Mul":
            m = tflite_mul_multiplier(ins[0].scale, ins[1].scale, out.scale) if config.tflite_multipliers else \
                np.float64(ins[0].scale) * np.float64(ins[1].scale) / np.float64(out.scale)
            _requant(graph, node, "", m, config)
        elif config.target == "tflite" and out.dtype == "int16":  # LiteRT's int16 ADD / SUB (quant/tflite_16x8.py)
            for role, m in add_multipliers_16(ins[0].scale, ins[1].scale, out.scale).items():
                _requant(graph, node, role, m, config)
            _add_int(graph, node, "left_shift", np.asarray(ADD_LEFT_SHIFT_16, np.int32))
        elif config.tflite_multipliers:
            for role, m in tflite_add_multipliers(ins[0].scale, ins[1].scale, out.scale).items():
                _requant(graph, node, role, m, config)
            _add_int(graph, node, "left_shift", np.asarray(TFLITE_ADD_LEFT_SHIFT, np.int32))
        else:
            for k in range(2):
                _requant(graph, node, str(k), np.float64(ins[k].scale) / np.float64(out.scale), config)
    elif kind == "pool":
        count = _mean_count(graph, node) if config.tflite_multipliers else None
        if count is None:
            _requant(graph, node, "", np.float64(ins[0].scale) / np.float64(out.scale), config)
        else:  # TFLite's MEAN: 1/count folded into the multiplier, one requantization of the sum
            mult, shift = tflite_mean_multiplier(np.float64(ins[0].scale) / np.float64(out.scale), count)
            _add_int(graph, node, "multiplier", mult)
            _add_int(graph, node, "shift", shift)
            _add_int(graph, node, "divisor", np.asarray(1, np.int32))
        if config.tflite_multipliers:  # no fractional bits kept before the division (TFLite's pools)
            _add_int(graph, node, "extra_bits", np.asarray(0, np.int32))
        if config.tflite_multipliers and node.op == "AveragePool" and ins[0].same_as(out):
            _add_int(graph, node, "code_average", np.asarray(1, np.int32))  # TFLite averages the codes
    elif kind == "lut":
        _lut(graph, node, config)
    elif _owns_rule(node):
        add = lambda role, data: _add_int(graph, node, role, data)  # noqa: E731
        if config.tflite_multipliers and node.op == "Softmax":
            from .tflite_softmax import quantize_integers as tflite_softmax

            tflite_softmax(graph, node, add)
        elif kind in ("prelu", "minmax"):  # rules that read the configuration (TFLite's multipliers)
            get_op(node.op).quantize_integers(graph, node, add, config)
        else:
            get_op(node.op).quantize_integers(graph, node, add)


def apply_parameters(graph, plan: Plan, observers: dict, config: QuantConfig, log=None) -> list:
    """Parameters on every planned value (from the observers' ranges, one set per sharing
    group) and the integers of every quantized node, in place. Returns the Concat nodes
    whose inputs' ranges were too far apart for one 8-bit grid (quantized in int16),
    each also reported through ``log``."""
    log = log or (lambda msg: warnings.warn(msg, stacklevel=3))
    wide = mismatched_concats(graph, plan, observers, config.concat_range_ratio)
    for m in wide:
        log(m.message("quantized in int16 (concat_range_ratio=0 keeps 8 bits)"))
    int16 = set(config.int16) | {m.node for m in wide}
    int16 |= {c for c, original in plan.copies.items() if original in int16}  # a named constant's copies too
    if config.target == "tflite" and int16:  # only the groups LiteRT's 16x8 kernels compute exactly
        int16 = writable_groups(graph, plan, int16, log)
    params = _group_params(graph, plan, observers, config, int16)
    plan.narrow_norms = narrow_norms(graph, plan, observers, params, config.norm_spread_codes)
    if plan.narrow_norms:
        for m in plan.narrow_norms:
            log(m.message("its input quantized in int16 (norm_spread_codes=0 keeps 8 bits)"))
        params = _group_params(graph, plan, observers, config, int16 | {m.value for m in plan.narrow_norms})
    for name, p in params.items():
        graph.values[name].quant = p
    if config.tflite_multipliers:
        _fix_tflite_outputs(graph, plan)
    if config.target == "tflite":  # a near-constant Softmax input: the smallest step TFLite's SOFTMAX takes
        widen_small_steps(graph, plan, log)
    widened = []
    for node in graph.nodes:
        kind = plan.kinds.get(node.name)
        if kind:
            _quantize_node(graph, node, kind, config, widened)
    _report_widened(widened, log)
    return wide


def _as_graph(model, optimize: bool):
    from .. import load
    from ..ir.graph import Graph
    from ..passes import optimize as run_passes

    graph = model if isinstance(model, Graph) else load(model)
    if any(v.quant is not None for v in graph.values.values()):
        raise NpuforgeError("the model is already quantized")
    if optimize:
        return run_passes(graph)[0]  # works on a copy
    return copy.deepcopy(graph)


def _step(steps: dict, name: str, layer_progress, fn, *args, **kwargs) -> None:
    """Run one of equalize / adaround / bias_correction, timed, its report kept under ``name``."""
    if layer_progress is not None and name != "equalize":
        kwargs["progress"] = lambda done, total: layer_progress(name.replace("_", " "), done, total)
    start = time.perf_counter()
    steps[name] = fn(*args, **kwargs)
    steps[name]["seconds"] = round(time.perf_counter() - start, 2)


def calibrated_plan(graph, data, config: QuantConfig, *, progress=None, log=None, gather=None):
    """(plan, observers, calibration images, seconds): what to quantize and the calibrated
    ranges, the inputs of :func:`apply_parameters` (QAT re-applies them as weights change).
    ``make_plan`` may give shared constants a copy per reader: ``graph`` changes in place.
    ``gather``: ``data`` is this process's shard (:func:`~npuforge.quant.calibrate.calibrate`)."""
    plan = make_plan(graph, config)
    for node, reason in plan.kept_float:
        msg = f"node '{node.name}' ({node.op}) kept in float: {reason}"
        (log or (lambda m: warnings.warn(m, stacklevel=3)))(msg)
    masks = additive_masks(graph, plan.activations)
    observers, images, seconds = calibrate(graph, data, plan.activations, config.method, bins=config.bins,
                                           percentile=config.percentile, engine=config.calibration_engine,
                                           progress=progress, slices=slices_of(graph, plan), masks=masks,
                                           gather=gather)
    finite_masks(graph, masks, observers, _levels(config.activation_dtype, config.symmetric))
    return plan, observers, images, seconds


def record(graph, config: QuantConfig, plan: Plan, images: int, wide_concats: list, steps: dict) -> None:
    """The quantization record in ``graph.metadata`` (what eval, analyze and the exports report). It
    holds no time taken: the same model, data and options give the same bytes, in one process or
    sharded over several."""
    graph.metadata["quantization"] = {
        "config": config.to_dict(),
        "calibration_images": images,
        "quantized_nodes": len(plan.kinds),
        "float_nodes": [n.name for n, _ in plan.kept_float],
        "int16_concats": [m.to_dict() for m in wide_concats],
        "int16_norms": [m.to_dict() for m in plan.narrow_norms],
        **{step: {k: v for k, v in report.items() if not isinstance(v, list) and k != "seconds"}
           for step, report in steps.items()},
    }


def quantize(model, data, config=None, *, optimize: bool = True, progress=None, log=None, layer_progress=None,
             gather=None):
    """Calibrate on ``data`` (an iterable of input batches, arrays or {name: array})
    and quantize: ``model`` (Graph or path) -> a new quantized Graph.

    The graph is first optimized with the default pass pipeline (BatchNorm
    folding, Pad folding, activation fusion...) unless ``optimize=False``.
    ``config``: a QuantConfig or a dict of its fields. ``progress(images)`` is
    called after each calibration batch, ``layer_progress(step, done, total)`` after each layer
    of AdaRound and bias correction; ``log(message)`` receives warnings (default: warnings.warn).
    ``gather`` (one process of several, each given a consecutive shard of the batches as ``data``):
    ``gather(obj)`` -> every process's ``obj`` in rank order; each process then returns the graph
    one process given every batch would.
    """
    config = config if isinstance(config, QuantConfig) else QuantConfig.from_dict(dict(config or {}))
    return _finish(_calibrated(model, data, config, optimize, progress, log, gather), config, layer_progress)


# steps that change a calibrated graph: configurations differing in these alone share one calibration
AFTER_CALIBRATION = ("adaround", "bias_correction", "ort_multipliers")


def quantize_variants(model, data, configs: list, *, optimize: bool = True, log=None) -> list:
    """``[quantize(model, data, c) for c in configs]``, the same graphs, where configurations that
    differ only in :data:`AFTER_CALIBRATION` steps share one calibration (and equalization)."""
    data, out, shared = list(data), [], {}
    for config in configs:
        key = repr(dataclasses.replace(config, **{s: False for s in AFTER_CALIBRATION}).to_dict())
        if key not in shared:
            shared[key] = _calibrated(model, data, config, optimize, None, log, None, keep_data=True)
        graph, feeds, plan, images, wide_concats, steps = shared[key]
        out.append(_finish((copy.deepcopy(graph), feeds, plan, images, wide_concats, dict(steps)), config, None))
    return out


def _calibrated(model, data, config: QuantConfig, optimize: bool, progress, log, gather, keep_data: bool = False):
    """(graph, data, plan, images, wide Concats, steps): ``model`` optimized (or copied), equalized
    when asked, calibrated and given its parameters, before any AFTER_CALIBRATION step.
    ``data`` comes back as a list when a later step reads it again (or ``keep_data``)."""
    graph = _as_graph(model, optimize)
    if config.target == "tflite":
        split_fused_leaky_relu(graph)
        decompose_for_tflite(graph)
    steps = {}
    if config.equalize:
        _step(steps, "equalize", None, equalize, graph)
    if config.bias_correction or config.adaround or keep_data:
        if gather is not None:
            raise NpuforgeError("bias correction and AdaRound run layer by layer on every calibration image in one "
                                "process; run them without torchrun")
        data = [as_feeds(graph, batch) for batch in data]  # read again after calibration
    plan, observers, images, _ = calibrated_plan(graph, data, config, progress=progress, log=log, gather=gather)
    wide_concats = apply_parameters(graph, plan, observers, config, log)
    return graph, data, plan, images, wide_concats, steps


def _finish(calibrated: tuple, config: QuantConfig, layer_progress):
    """The AFTER_CALIBRATION steps ``config`` asks for on a :func:`_calibrated` graph, and its record."""
    graph, data, plan, images, wide_concats, steps = calibrated
    compute = {name for name, kind in plan.kinds.items() if kind == "compute"}
    if config.adaround:
        _step(steps, "adaround", layer_progress, adaround, graph, data, compute, iterations=config.adaround_iters,
              bias_correction=config.adaround_bias_correction, cache_dir=config.adaround_cache or None)
    if config.bias_correction:
        _step(steps, "bias_correction", layer_progress, correct_bias, graph, data, compute)
    if config.resolved_ort_multipliers:  # last: it depends on the final weights and biases
        products = {name for name, kind in plan.kinds.items() if kind == "matmul"}  # of two activations
        _step(steps, "ort_multipliers", None, match_multipliers, graph, compute | products)
    record(graph, config, plan, images, wide_concats, steps)
    graph.check()
    return graph
