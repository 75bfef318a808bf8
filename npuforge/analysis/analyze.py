"""The whole analysis: calibrate once, quantize, per-layer errors in both views,
ranking, how much of the drop the worst layers explain, fixes on the worst ones,
and (with a target drop) the mixed-precision search. Returns one JSON-ready dict
(the report's input) and the searched quantized graph."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..quant.config import QuantConfig
from ..quant.layerwise import fixed_batch
from ..quant.observers import METHODS
from .layers import LayerProbe
from .search import Scorer, explain, program_key, search, try_fixes, with_changes
from .session import Calibration, Evaluator, ort_logits


def _histogram(calibration, value: str, params, bins: int = 96) -> dict:
    """The calibration histogram of a value, cut to its observed range and re-binned, with
    the chosen clipping range (what the quantized grid covers)."""
    h = calibration.observed[value].hist
    edges = np.linspace(-h.bound, h.bound, h.hist.size + 1)
    keep = (edges[1:] > min(h.lo, 0.0)) & (edges[:-1] < max(h.hi, 0.0))
    counts, lo_edge = h.hist[keep], edges[:-1][keep]
    width = edges[1] - edges[0]
    group = max(1, int(np.ceil(counts.size / bins)))
    pad = (-counts.size) % group
    counts = np.concatenate([counts, np.zeros(pad)]).reshape(-1, group).sum(axis=1)
    start = float(lo_edge[0]) if lo_edge.size else 0.0
    clip_lo = float((params.qmin - int(params.zero_point)) * float(params.scale))
    clip_hi = float((params.qmax - int(params.zero_point)) * float(params.scale))
    return {"start": start, "bin_width": float(width * group), "counts": counts.tolist(),
            "min": float(h.lo), "max": float(h.hi), "clip": [clip_lo, clip_hi], "dtype": params.dtype}


DEFAULT_REMEDIES = (("equalize",), ("equalize", "bias_correction"))
REMEDIES = ("equalize", "bias_correction", "adaround")


def _remedies(graph, calib_batches, config: QuantConfig, remedies: tuple, ev, int8: float, log) -> list[dict]:
    """top-1 of the whole model quantized by ``npuforge.quantize`` with each remedy's steps on (the
    remedies that differ only in steps after calibration calibrate once: ``quantize_variants``);
    each row's seconds: its evaluation and an equal part of the quantizing."""
    from ..quant.quantize import quantize_variants

    start = time.perf_counter()
    graphs = quantize_variants(graph, list(calib_batches), [dataclasses.replace(config, **{s: True for s in steps})
                                                             for steps in remedies], optimize=False,
                               log=lambda m: None)
    share = (time.perf_counter() - start) / max(len(remedies), 1)
    rows = []
    for steps, q in zip(remedies, graphs):
        begin = time.perf_counter()
        top1 = ev.top1(q)
        rows.append({"remedy": " + ".join(s.replace("_", " ") for s in steps), "top1": round(top1, 3),
                     "delta": round(top1 - int8, 3), "seconds": round(share + time.perf_counter() - begin, 1)})
        log(f"  {' + '.join(steps)}: top-1 {rows[-1]['top1']:.2f}% ({rows[-1]['delta']:+.2f})")
    return rows


def analyze(graph, calib_batches, x_eval: np.ndarray, y_eval: np.ndarray, config: QuantConfig | None = None, *,
            analysis_images: int = 16, fix_layers: int = 3, target_drop: float | None = None,
            max_layers: int = 16, engine: str = "int", log=None, optimize: bool = True,
            remedies: tuple = DEFAULT_REMEDIES, batch_size: int = 50):
    """-> (result dict, quantized graph: the search's choice with a target, else plain int8).

    ``remedies``: whole-model steps of ``npuforge.quantize`` to measure, each a tuple of
    QuantConfig flags (equalize, bias_correction, adaround) turned on together."""
    from ..passes import optimize as run_passes

    log = log or (lambda m: None)
    config = config or QuantConfig()
    timings = {}
    t0 = start = time.perf_counter()

    def lap(name):
        nonlocal start
        now = time.perf_counter()
        timings[name] = round(now - start, 2)
        start = now

    opt = run_passes(graph)[0] if optimize else graph
    log(f"calibrating on the calibration images ({config.method} and every other observer at once)")
    cal = Calibration(opt, calib_batches, bins=config.bins, percentile=config.percentile,
                      engine=config.calibration_engine)
    qgraph = cal.build(config)
    for name in qgraph.metadata["quantization"]["float_nodes"]:
        log(f"note: node '{name}' kept in float (no quantization rule)")
    for m in qgraph.metadata["quantization"]["int16_concats"]:
        log(f"note: Concat '{m['node']}' quantized in int16: its inputs' ranges differ {m['ratio']:.0f}x")
    lap("calibrate_and_quantize")

    ev = Evaluator(x_eval, y_eval, engine, batch_size, log=log)
    fp32, int8 = ev.top1(opt), ev.top1(qgraph)
    log(f"top-1 on {len(x_eval)} images: FP32 {fp32:.2f}%, int8 {int8:.2f}%")
    lap("evaluate")

    probe = LayerProbe(qgraph)
    fixed = fixed_batch(opt)
    chunk = fixed or 8  # a model's fixed batch is the only one it runs
    xa = x_eval[:analysis_images]
    wide = {layer.node: {"int16": cal.value_params(layer.output, config.method, "int16", True)}
            for layer in probe.layers if layer.output in cal.observed}
    log(f"per-layer errors on {len(xa)} images: {len(probe.layers)} layers, cumulative and isolated")
    probe.run(xa, chunk, variants=wide)
    lap("layer_errors")
    float_logits = ort_logits(opt, xa, batch_size)
    errors = probe.output_errors(xa, float_logits, {layer.node: (layer.node, "same") for layer in probe.layers},
                                 batch_size)
    for layer in probe.layers:
        layer.to_output = errors[layer.node]
    ranked = probe.rank()
    lap("isolated_output_errors")

    scorer = Scorer(cal, ev, config, log=log)
    scorer.memo[((), ())] = scorer.programs[program_key(qgraph)] = int8
    log("how much of the drop the worst layers explain (kept in float)")
    explained = explain(scorer, ranked, fp32, int8)
    lap("explain")
    # the other observers' isolated errors at the outputs of the layers the fixes are tried on
    observers = {layer.node: {f"observer:{m}": cal.value_params(layer.output, m, config.activation_dtype,
                                                                config.symmetric) for m in METHODS}
                 for layer in ranked[:fix_layers] if layer.output in cal.observed}
    if observers:
        probe.run(xa, chunk, variants=observers, errors=False)
    fixes = []
    for layer in ranked[:fix_layers]:
        log(f"fixes for {layer.node}")
        fixes += try_fixes(scorer, layer, int8)
    lap("fixes")

    if remedies:
        log(f"whole-model remedies: quantizing with {'; '.join(' + '.join(steps) for steps in remedies)}")
    remedy_rows = _remedies(opt, calib_batches, config, remedies, ev, int8, log)
    lap("remedies")

    result_search = None
    best = qgraph
    if target_drop is not None:
        log(f"mixed-precision search: top-1 within {target_drop} of FP32 with the fewest int16 / float layers")
        result_search = search(scorer, ranked, fp32, int8, target_drop, max_layers)
        best = cal.build(with_changes(config, result_search["changes"]))
        if ev.engine == "ort":  # the number npuforge eval prints for the written model (with "int": its own)
            result_search["top1_fake_quant"] = round(Evaluator(x_eval, y_eval, "npuforge", batch_size).top1(best), 3)
        lap("search")

    worst = ranked[:max(fix_layers, 4)]
    result = {
        "config": config.to_dict(),
        "calibration_images": cal.images,
        "evaluation_images": int(len(x_eval)),
        "analysis_images": int(len(xa)),
        "engine": ev.engine,
        "fp32_top1": round(fp32, 3), "int8_top1": round(int8, 3), "drop": round(fp32 - int8, 3),
        "output": probe.output_stats.to_dict(),
        "layers": [_layer_dict(layer) for layer in probe.layers],
        "ranking": [layer.node for layer in ranked],
        "int16_concats": qgraph.metadata["quantization"]["int16_concats"],
        "explained": explained,
        "fixes": fixes,
        "remedies": remedy_rows,
        "search": result_search,
        "details": {layer.node: {
            "histogram": _histogram(cal, layer.output, qgraph.values[layer.output].quant)
            if layer.output in cal.observed else None,
            "weights": layer.weights, "weight_clip": _weight_clip(qgraph, layer.node, config)} for layer in worst},
        "evaluations": ev.runs,
        "timings": timings,
    }
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result, best


def _weight_clip(qgraph, node_name: str, config: QuantConfig) -> float | None:
    """The per-tensor weight range the quantizer chose (after mse clipping); None per channel."""
    node = next(n for n in qgraph.nodes if n.name == node_name)
    if len(node.inputs) < 2 or not node.inputs[1] or qgraph.values[node.inputs[1]].quant is None:
        return None
    p = qgraph.values[node.inputs[1]].quant
    return None if p.axis is not None else float(p.scale) * (63 if config.reduce_range else 127)


def _layer_dict(layer) -> dict:
    w = layer.weights
    return {
        "name": layer.node, "op": layer.op, "kind": layer.kind, "depth": layer.depth, "rank": layer.rank,
        "sqnr_db": round(layer.cumulative.sqnr_db, 3),
        "isolated_sqnr_db": round(layer.isolated.sqnr_db, 3),
        "cosine": round(layer.cumulative.cosine, 6),
        "isolated_cosine": round(layer.isolated.cosine, 6),
        "rel_mse": layer.cumulative.to_dict()["rel_mse"],
        "isolated_rel_mse": layer.isolated.to_dict()["rel_mse"],
        "output_sqnr_db": round(layer.to_output.sqnr_db, 3),
        "drop_share": round(layer.share, 4),
        "int16_isolated_sqnr_db": round(layer.variants["int16"].sqnr_db, 3) if "int16" in layer.variants else None,
        "weights": None if w is None else {**{k: w[k] for k in ("channels", "range_spread", "outlier_channels",
                                                                "outlier_weights", "sqnr_per_tensor_db",
                                                                "sqnr_per_channel_db")},
                                           "channel_min": [round(v, 6) for v in w["min"]],
                                           "channel_max": [round(v, 6) for v in w["max"]]},
    }
