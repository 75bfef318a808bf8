"""Calibration: run the float graph over data batches and feed one observer per
activation value. Streaming: only the observers' statistics are kept."""

from __future__ import annotations

import re
import time
from typing import Iterable

import numpy as np
import torch

from ..arrays import Feed
from ..errors import NpuforgeError, UnsupportedError
from ..sim.float_exec import execute
from .attention_mask import KeptPositions
from .layerwise import fixed_batch
from .norm_spread import track_spreads
from .observers import make_observer


def as_feeds(graph, batch) -> dict:
    if isinstance(batch, dict):
        return batch
    if len(graph.inputs) != 1:
        raise NpuforgeError(f"the graph has {len(graph.inputs)} inputs; give calibration batches as dicts "
                            f"{{input name: array}}")
    return {graph.inputs[0]: np.asarray(batch)}


ENGINES = ("ort", "npuforge")


def _ort_error(graph, e: Exception, when: str) -> NpuforgeError:
    """ONNX Runtime's failure as one line naming the model and, when ORT says, the node."""
    text = " ".join(str(e).split())
    node = re.search(r"[Nn]ode\.? ?[Nn]ame:? ?'([^']*)'", text) or re.search(r"[Nn]ode \(([^)]*)\)", text)
    where = f"model '{graph.name}'" + (f", node '{node.group(1)}'" if node else "")
    return NpuforgeError(f"calibration: ONNX Runtime could not {when} {where}: {text[:300]}; check the model with "
                         f"'npuforge check' or calibrate with the npuforge engine")


def split_to_fixed_batch(graph, feeds: dict) -> list[dict]:
    """Feeds cut into batches of the size the model fixes (most exported files fix batch 1), so a
    fixed-batch model is calibrated on any number of images; a short last batch is completed with
    images of the same batch seen again (no range or histogram gains a value it did not have)."""
    fixed = fixed_batch(graph)
    rows = {len(np.asarray(a)) if np.ndim(a) else 1 for a in feeds.values()}
    if fixed is None or len(rows) != 1 or rows == {fixed}:
        return [feeds]
    if fixed < 1:
        raise NpuforgeError(f"model '{graph.name}': input '{graph.inputs[0]}' has batch dim {fixed}; re-export it with "
                            f"a dynamic batch or a batch of 1")
    n = rows.pop()
    count = -(-n // fixed)
    return [{k: np.take(a, np.arange(i * fixed, (i + 1) * fixed) % n, axis=0) for k, a in feeds.items()}
            for i in range(count)]


def _ort_forward(graph, names: set):
    """The float graph in ONNX Runtime with every observed value as an extra output:
    the same numbers as npuforge's float executor (tested to 1e-5), several times faster."""
    import onnx
    import onnxruntime as ort

    from ..export import to_onnx

    model = to_onnx(graph)
    fetch = sorted(n for n in names if n not in graph.inputs)
    present = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in fetch if n not in present)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own types (Fail, InvalidGraph, RuntimeException...)
        raise _ort_error(graph, e, "load") from None

    def run(feeds: dict, observe) -> None:
        for name, array in feeds.items():
            observe(name, torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)))
        try:
            results = session.run(fetch, feeds)
        except Exception as e:
            raise _ort_error(graph, e, "run") from None
        for name, array in zip(fetch, results):
            observe(name, torch.from_numpy(array))

    return run


def check_finite_weights(graph) -> None:
    """Every weight and bias a quantized compute op reads is finite: a NaN / Inf there has no int8
    code, and calibration would report it as bad input data. (Other constants may hold -inf on
    purpose, as an attention mask does.)"""
    from ..ops.registry import get_op

    for node in graph.nodes:
        if get_op(node.op).quant_kind(node, graph) != "compute":
            continue
        for name in node.inputs[1:3]:
            v = graph.values.get(name) if name else None
            if v is not None and v.is_const and v.data.dtype.kind == "f" and not np.isfinite(v.data).all():
                bad = v.data[~np.isfinite(v.data)].reshape(-1)[0]
                raise NpuforgeError(f"model '{graph.name}': initializer '{name}' of node '{node.name}' ({node.op}) "
                                    f"holds {bad}; fix the model's weights (every weight and bias must be finite)")


def merge_shards(shards: list) -> tuple[dict, int]:
    """[(observers, images)] of consecutive shards of the batches -> the statistics of them all."""
    observers, images = shards[0]
    for more, count in shards[1:]:
        for name, obs in observers.items():
            obs.merge(more[name])
            if getattr(obs, "spread", None) is not None:
                obs.spread.merge(more[name].spread)
        images += count
    return observers, images


def calibrate(graph, batches: Iterable, names: set, method: str, *, bins: int = 4096, percentile: float = 99.99,
              engine: str = "ort", progress=None, slices: dict | None = None,
              masks: dict | None = None, gather=None) -> tuple[dict, int, float]:
    """-> (observers by value name, images seen, seconds).

    ``engine``: who runs the float graph, "ort" (ONNX Runtime, fast) or
    "npuforge" (the float executor). ``slices`` ({value: (axes, centred)}, the
    normalizations' inputs) gives those observers a ``spread`` as well, the
    narrowest slice seen (npuforge/quant/norm_spread.py). ``masks`` ({Add output: (mask, dropped
    positions)}, npuforge/quant/attention_mask.py): those observers see the kept positions only.
    ``gather`` (one shard of the batches per process, ``torchrun``): ``gather(obj)`` -> every
    process's ``obj`` in rank order; the shards' statistics are merged in that order, exactly
    as one process that saw all the batches would have them."""
    check_finite_weights(graph)
    observers = {name: make_observer(method, bins, percentile) for name in names}
    track_spreads(observers, slices or {})
    for name, (_, dropped) in (masks or {}).items():
        observers[name] = KeptPositions(observers[name], dropped)
    producer = {out: n for n in graph.nodes for out in n.outputs}
    batch_index = 0

    def observe(name: str, t: torch.Tensor) -> torch.Tensor:
        obs = observers.get(name)
        if obs is not None:
            try:
                obs.update(t)
                if getattr(obs, "spread", None) is not None:
                    obs.spread.update(t)
            except FloatingPointError:
                node = producer.get(name)
                where = f"node '{node.name}' ({node.op})" if node else "the graph input"
                raise NpuforgeError(f"calibration batch {batch_index}: value '{name}' from {where} holds NaN or Inf; "
                                    f"check the input data and preprocessing") from None
        return t

    images = 0
    start = time.perf_counter()

    def npuforge_forward(feeds, observe):
        execute(graph, feeds, outputs=graph.outputs, value_hook=observe)

    forward = npuforge_forward
    if engine == "ort":
        try:
            forward = _ort_forward(graph, names)
        except UnsupportedError:  # an op with no ONNX form: npuforge's executor computes the same numbers
            pass
    for batch in batches:
        feeds = {k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else v
                 for k, v in as_feeds(graph, batch).items()}
        for part in split_to_fixed_batch(graph, feeds):
            forward(part, observe)
        images += 1 if isinstance(batch, Feed) else len(next(iter(feeds.values())))  # a Feed: one whole sample
        batch_index += 1
        if progress is not None:
            progress(images)
    if gather is not None:
        observers, images = merge_shards(gather((observers, images)))
    if images == 0:
        raise NpuforgeError("calibration got no data; give at least one batch of images")
    return observers, images, time.perf_counter() - start
