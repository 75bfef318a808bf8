"""One calibration, many quantized variants.

Observers do not depend on which layers end up in int16 or float, so the float
graph runs over the calibration data once, feeding for every activation a mean
observer and a histogram observer (whose exact min/max is the minmax method and
whose histogram serves percentile, kl and mse). ``build`` then quantizes with any
QuantConfig, and per value with any observer method, from that cache: the same
steps as ``npuforge.quantize`` after calibration (plan, parameters per sharing
group, integers per node), through the quantizer's own helpers.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import onnxruntime as ort

from ..errors import NpuforgeError
from ..quant.calibrate import _ort_forward, as_feeds
from ..quant.config import QuantConfig
from ..quant.norm_spread import slices_of, track_spreads
from ..quant.observers import HistogramObserver, MeanObserver
from ..quant.quantize import apply_parameters, make_plan, record
from ..sim.float_exec import execute
from .prefix import PrefixCache


class _MethodView:
    """An observer answering ``range(levels)`` for one method from the shared statistics."""

    def __init__(self, entry: "_Observed", method: str):
        self.entry, self.method = entry, method
        self.spread = entry.spread  # a normalization input's narrowest slice (or None)

    def range(self, levels: int):
        return self.entry.range(self.method, levels)


class _Observed:
    def __init__(self, bins: int, percentile: float):
        self.mean = MeanObserver()
        self.hist = HistogramObserver("mse", bins, percentile)
        self.spread = None
        self._memo: dict = {}

    def update(self, t) -> None:
        self.mean.update(t)
        self.hist.update(t)
        if self.spread is not None:
            self.spread.update(t)

    def range(self, method: str, levels: int):
        key = (method, levels)
        if key not in self._memo:
            if method == "minmax":
                r = (self.hist.lo, self.hist.hi)
            elif method == "mean":
                r = self.mean.range(levels)
            else:
                h = copy.copy(self.hist)  # shares the counts; range() does not modify them
                h.method = method
                with np.errstate(invalid="ignore", divide="ignore"):  # kl on a degenerate histogram
                    r = h.range(levels)
            self._memo[key] = (float(r[0]), float(r[1]))
        return self._memo[key]


class Calibration:
    """Statistics of every activation of ``graph`` (an optimized float Graph) over ``batches``."""

    def __init__(self, graph, batches, *, bins: int = 4096, percentile: float = 99.99, engine: str = "ort",
                 progress=None):
        self.graph = graph
        plan = make_plan(graph, QuantConfig())
        names = plan.activations
        self.observed = {n: _Observed(bins, percentile) for n in names}
        track_spreads(self.observed, slices_of(graph, plan))

        def observe(name, t):
            entry = self.observed.get(name)
            if entry is not None:
                try:
                    entry.update(t)
                except FloatingPointError:
                    raise NpuforgeError(f"calibration: value '{name}' holds NaN or Inf; check the input data "
                                        f"and preprocessing") from None
            return t

        if engine == "ort":
            forward = _ort_forward(graph, names)
        else:
            def forward(feeds, observe):
                execute(graph, feeds, outputs=graph.outputs, value_hook=observe)
        self.images = 0
        start = time.perf_counter()
        for batch in batches:
            feeds = {k: np.asarray(v, np.float32) for k, v in as_feeds(graph, batch).items()}
            forward(feeds, observe)
            self.images += len(next(iter(feeds.values())))
            if progress is not None:
                progress(self.images)
        if self.images == 0:
            raise NpuforgeError("calibration got no data; give at least one batch of images")
        self.seconds = time.perf_counter() - start

    def observers(self, method: str, overrides: dict | None = None) -> dict:
        overrides = overrides or {}
        return {n: _MethodView(e, overrides.get(n, method)) for n, e in self.observed.items()}

    def value_params(self, name: str, method: str, dtype: str, symmetric: bool):
        """Parameters of one value alone (no sharing group) from ``method``'s range."""
        from ..quant.params import from_range
        from ..quant.quantize import _levels

        return from_range(*self.observed[name].range(method, _levels(dtype, symmetric)), dtype, symmetric)

    def build(self, config: QuantConfig, methods: dict | None = None):
        """The quantized graph for ``config``; ``methods`` maps value names to another observer method."""
        nodes = {n.name for n in self.graph.nodes}
        for option in ("int16", "keep_float", "per_channel"):
            unknown = [n for n in getattr(config, option) if n not in nodes and n not in self.graph.values]
            if unknown:
                raise NpuforgeError(f"{option} names unknown node(s): {', '.join(unknown)}")
        steps = [s for s in ("equalize", "bias_correction", "adaround") if getattr(config, s, False)]
        if steps:  # they change weights after calibration; quantize() runs them, this builder does not
            raise NpuforgeError(f"the analysis builds configurations without {', '.join(steps)}; "
                                f"analyse without them")
        graph = copy.deepcopy(self.graph)
        plan = make_plan(graph, config)
        wide = apply_parameters(graph, plan, self.observers(config.method, methods), config, log=lambda m: None)
        record(graph, config, plan, self.images, wide, steps={})
        if methods:
            graph.metadata["quantization"]["observer_overrides"] = dict(sorted(methods.items()))
        graph.check()
        return graph


ENGINES = ("int", "ort", "npuforge")


class Evaluator:
    """Top-1 of a float or quantized graph over fixed, preprocessed images.

    engine "int" (the default): a quantized graph's integer program, on the simulator's
    fast exact path (ONNX Runtime's integer kernels, fixed-point rounding: what
    ``npuforge eval --engine int`` computes), its nodes kept in float in ONNX Runtime's
    float kernels. When the first quantized graph has no such lowering, every quantized
    graph after it is scored as with "ort" (a note says so); a later variant that alone
    has none runs on the plain simulator. engine "ort": the quantized graph as QDQ in ONNX
    Runtime with its graph optimizations off, so Q/DQ stay separate float ops and no int8
    kernel runs (the fake-quant numbers, up to float rounding). engine "npuforge":
    npuforge's float / fake-quant executor. Float graphs run in ONNX Runtime (float) with
    "int" and "ort".
    """

    def __init__(self, x: np.ndarray, labels: np.ndarray, engine: str = "int", batch_size: int = 50, log=None):
        if engine not in ENGINES:
            raise NpuforgeError(f"--engine {engine}: choose {', '.join(ENGINES)}")
        self.x, self.labels, self.engine, self.batch_size = x, labels, engine, batch_size
        self.log = log or (lambda m: None)
        self.runs = 0
        self.seconds = 0.0
        self._lowered_once = False
        self._codes: dict = {}  # the images quantized once per distinct input grid
        self._prefixes = PrefixCache()  # codes where variants leave the first program, to start there

    def logits(self, graph) -> np.ndarray:
        from ..sim.fake_quant import is_quantized, run_fake_quant

        start = time.perf_counter()
        quantized = is_quantized(graph)
        name = graph.inputs[0]
        if self.engine == "int" and quantized:
            out = self._integer_logits(graph)
        elif self.engine in ("int", "ort"):
            out = ort_logits(graph, self.x, self.batch_size)
        else:
            def run(b):
                feeds = {name: b}
                return (run_fake_quant(graph, feeds) if quantized else graph.run(feeds))[graph.outputs[0]]
            out = np.concatenate([run(self.x[i:i + self.batch_size]) for i in range(0, len(self.x), self.batch_size)])
        self.runs += 1
        self.seconds += time.perf_counter() - start
        return out

    def _integer_logits(self, graph) -> np.ndarray:
        """The integer program's logits; from where it first differs from the first program scored
        when the codes there are kept (:mod:`npuforge.analysis.prefix`)."""
        from ..ir.subgraph import suffix, with_outputs
        from ..sim.lowered import make_simulator

        out = graph.outputs[0]
        first, kept = self._prefixes.start(graph)
        if kept is not None:
            sim = make_simulator(suffix(graph, first), "fixedpoint", "fast")
            if not getattr(sim, "fallback", None):
                return self._dequantized(graph, out, self._run(sim, kept, [out])[out])
        keep = self._prefixes.worth_keeping(graph, first, len(self.x)) if first and kept is None else None
        sim = make_simulator(with_outputs(graph, keep) if keep else graph, "fixedpoint", "fast")
        why = getattr(sim, "fallback", None)  # set when the plain simulator was all make_simulator had
        if why and not self._lowered_once:
            self.log(f"note: the integer program has no fast lowering ({why}); top-1 is scored on the QDQ "
                     f"model in ONNX Runtime instead (--engine ort)")
            self.engine = "ort"
            return ort_logits(graph, self.x, self.batch_size)
        if why:
            self.log(f"note: this variant has no fast lowering ({why}); the plain integer simulator scores it")
        self._lowered_once = True
        name = graph.inputs[0]
        codes = self._run(sim, {name: self._input_codes(graph.values[name].quant)}, [out, *(keep or [])])
        if keep and not why:
            self._prefixes.keep(graph, first, {n: codes[n] for n in keep})
        return self._dequantized(graph, out, codes[out])

    def _run(self, sim, feeds: dict, names: list) -> dict:
        """{name: output codes} of ``sim`` over ``feeds`` (arrays over every image), batch by batch."""
        return batched(lambda b: sim.run(b, names, dequantize=False), feeds, names, self.batch_size)

    @staticmethod
    def _dequantized(graph, name: str, codes: np.ndarray) -> np.ndarray:
        from ..sim.integer import dequantize_output

        p = graph.values[name].quant
        return codes if p is None or codes.dtype.kind == "f" else dequantize_output(codes, p)

    def _input_codes(self, p) -> np.ndarray:
        """The images as the integer program's input codes (its host's QuantizeLinear), computed once
        per input grid and fed as codes; the float images where the input is not quantized."""
        from ..quant.params import check_finite
        from ..sim.integer import quantize_input

        if p is None:
            return self.x
        key = (p.dtype, p.axis, np.asarray(p.scale).tobytes(), np.asarray(p.zero_point).tobytes())
        if key not in self._codes:
            check_finite(self.x, "the evaluation images", "the integer simulator")
            self._codes[key] = quantize_input(self.x, p)
        return self._codes[key]

    def top1(self, graph) -> float:
        return top1(self.logits(graph), self.labels)


def ort_logits(graph, x: np.ndarray, batch_size: int = 50, optimized: bool = False) -> np.ndarray:
    """The graph's first output in ONNX Runtime: float, or QDQ with graph optimizations off.
    ``optimized``: a QDQ graph with ONNX Runtime's float optimizations on (its blocked conv
    layout, fused activations) but no QDQ fusion, so Q/DQ still run as float ops: the same
    fake-quant function in another summation order, 2.2x faster on a mostly float graph.
    ``x``: the first input's images, or {input name: array} for a graph of several inputs."""
    return ort_outputs(graph, x, [graph.outputs[0]], batch_size, optimized)[graph.outputs[0]]


def ort_outputs(graph, x, names: list, batch_size: int = 50, optimized: bool = False) -> dict:
    """{name: array} of the graph's outputs ``names`` in ONNX Runtime (as :func:`ort_logits`), over
    ``x`` (the first input's images, or {input name: array}) in batches of ``batch_size``."""
    from ..export import to_onnx, to_qdq_onnx
    from ..sim.fake_quant import is_quantized

    quantized = is_quantized(graph)
    model = to_qdq_onnx(graph) if quantized else to_onnx(graph)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if quantized and optimized:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    elif quantized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = x if isinstance(x, dict) else {session.get_inputs()[0].name: x}
    return batched(lambda b: dict(zip(names, session.run(names, b))), feeds, names, batch_size)


def batched(run, feeds: dict, names: list, batch_size: int) -> dict:
    """{name: array over every image} of ``run`` ({input: batch} -> {name: array}) called on
    ``feeds`` (arrays over every image) ``batch_size`` images at a time."""
    n = len(next(iter(feeds.values())))
    runs = [run({k: v[i:i + batch_size] for k, v in feeds.items()}) for i in range(0, n, batch_size)]
    return {name: np.concatenate([np.asarray(r[name]) for r in runs]) for name in names}


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    return 100.0 * float((np.argmax(logits, axis=1) == labels).mean())
