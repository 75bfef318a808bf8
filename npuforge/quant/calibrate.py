"""Calibration: run the float graph over data batches and feed one observer per
activation value. Streaming: only the observers' statistics are kept."""

from __future__ import annotations

import time
from typing import Iterable

import numpy as np
import torch

from ..errors import NpuforgeError
from ..sim.float_exec import execute
from .observers import make_observer


def as_feeds(graph, batch) -> dict:
    if isinstance(batch, dict):
        return batch
    if len(graph.inputs) != 1:
        raise NpuforgeError(f"the graph has {len(graph.inputs)} inputs; give calibration batches as dicts "
                            f"{{input name: array}}")
    return {graph.inputs[0]: np.asarray(batch)}


def calibrate(graph, batches: Iterable, names: set, method: str, *, bins: int = 4096, percentile: float = 99.99,
              progress=None) -> tuple[dict, int, float]:
    """-> (observers by value name, images seen, seconds)."""
    observers = {name: make_observer(method, bins, percentile) for name in names}
    producer = {out: n for n in graph.nodes for out in n.outputs}
    batch_index = 0

    def observe(name: str, t: torch.Tensor) -> torch.Tensor:
        obs = observers.get(name)
        if obs is not None:
            try:
                obs.update(t)
            except FloatingPointError:
                node = producer.get(name)
                where = f"node '{node.name}' ({node.op})" if node else "the graph input"
                raise NpuforgeError(f"calibration batch {batch_index}: value '{name}' from {where} holds NaN or Inf; "
                                    f"check the input data and preprocessing") from None
        return t

    images = 0
    start = time.perf_counter()
    for batch in batches:
        feeds = as_feeds(graph, batch)
        execute(graph, feeds, outputs=graph.outputs, value_hook=observe)
        images += len(next(iter(feeds.values())))
        batch_index += 1
        if progress is not None:
            progress(images)
    if images == 0:
        raise NpuforgeError("calibration got no data; give at least one batch of images")
    return observers, images, time.perf_counter() - start
