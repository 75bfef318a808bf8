"""Additive attention masks: a constant that adds -inf (or any value at or below ``DROPPED``) where a
Softmax must give 0, as decoders' causal masks do (GPT-2: ``scores + where(tril, 0, -inf)``).

Such a value has no int8 code, and an observer that saw it would stretch the scores' range over 10^38.
So the calibration observes the mask's Add output at the kept positions only; its range is then given
at least ``SOFTMAX_SPAN`` (a dropped position's weight e^-16 ~ 1e-7 is below the output step of any
8- or 16-bit Softmax), and the dropped entries of the constant become a finite value that takes every
score below that range: the Add saturates them at its lowest code, the Softmax gives them 0 as the
float model does. Everything after it (integer simulator, exports, compiler) sees an ordinary Add.
"""

from __future__ import annotations

import numpy as np

DROPPED = -1e4  # a mask entry at or below this drops its position (BERT's -10000, finfo.min, -inf)
SOFTMAX_SPAN = 16.0


def additive_masks(graph, quantized_values) -> dict[str, tuple[str, np.ndarray]]:
    """{Add output: (its mask constant, the constant's dropped positions)} for each quantized Add of an
    activation and a constant additive mask whose result only a Softmax reads."""
    readers = graph.consumers()
    masks = {}
    for node in graph.nodes:
        if node.op != "Add" or node.outputs[0] not in quantized_values:
            continue
        if not readers.get(node.outputs[0]) or any(r.op != "Softmax" for r in readers[node.outputs[0]]):
            continue
        for name in node.inputs:
            v = graph.values[name]
            if v.is_const and v.data.dtype.kind == "f" and not np.isnan(v.data).any():
                dropped = v.data <= DROPPED
                if dropped.any() and np.isfinite(v.data[~dropped]).all():
                    masks[node.outputs[0]] = (name, dropped)
    return masks


class KeptPositions:
    """An observer of an Add output that sees the positions its mask keeps only."""

    def __init__(self, observer, dropped: np.ndarray):
        self.observer, self.dropped = observer, dropped

    def update(self, t):
        import torch

        keep = ~torch.from_numpy(np.broadcast_to(self.dropped, tuple(t.shape)).copy())
        self.observer.update(t[keep])

    def range(self, levels: int) -> tuple[float, float]:
        lo, hi = self.observer.range(levels)
        return min(lo, hi - SOFTMAX_SPAN), hi

    def merge(self, other: "KeptPositions") -> None:
        self.observer.merge(other.observer)

    def __getattr__(self, name):  # spread, histograms...: the wrapped observer's
        return getattr(self.observer, name)


def finite_masks(graph, masks: dict, observers: dict, levels: int) -> None:
    """After calibration: each mask's dropped entries set to twice the span of its Add's range below 0
    (every score in the range plus that is below the range), in place."""
    fill: dict[str, float] = {}
    for out, (name, _) in masks.items():
        lo, hi = observers[out].range(levels)
        fill[name] = min(fill.get(name, 0.0), -2.0 * (hi - lo))
    for out, (name, dropped) in masks.items():
        v = graph.values[name]
        v.data = np.where(dropped, np.float32(fill[name]), v.data).astype(v.data.dtype)
