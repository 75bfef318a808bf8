"""Normalizations whose input slices span too few steps of their 8-bit grid.

A LayerNormalization divides each slice (a token's row, a channel's map) by its own
spread. Its input's grid is shared by all slices, and one slice can be far narrower
than the rest: a ViT's class token (timm's std 1e-6 init plus a position embedding)
beside the patch tokens, or a BERT residual stream's ordinary rows beside its outlier
channels. Such a slice lands on a few codes, and the normalization then scales their
rounding up to the full output range: the 8-bit program's output for that slice is
noise (a random-weight ViT's class-token logits: cosine 0.905 with float). The
quantizer measures each slice's spread during calibration (the standard deviation, or
for L2Normalize the root mean square) and quantizes the input of a normalization whose
narrowest slice spans fewer than ``norm_spread_codes`` steps in int16, warning naming
it, unless told not to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class SliceSpread:
    """The smallest non-zero spread of any slice seen: the standard deviation over
    ``dims`` (``centred``) or the root mean square (not). A constant slice (spread 0)
    normalizes to its bias whatever the grid, so it does not count."""

    def __init__(self, dims: tuple, centred: bool):
        self.dims, self.centred, self.smallest = tuple(dims), centred, float("inf")

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().to(torch.float64)
        if self.centred:
            spread = x.std(dim=self.dims, unbiased=False)
        else:
            spread = (x * x).mean(dim=self.dims).sqrt()
        spread = spread[spread > 0]
        if spread.numel():
            self.smallest = min(self.smallest, float(spread.min()))

    def merge(self, other: "SliceSpread") -> None:
        self.smallest = min(self.smallest, other.smallest)


def slices_of(graph, plan) -> dict:
    """{input value: (normalized axes, centred)} of every node quantized by the normalization rule."""
    from . import layernorm_rule

    found = {}
    for node in graph.nodes:
        if plan.kinds.get(node.name) == "layernorm" and node.inputs[0] in plan.activations:
            dims, _, _ = layernorm_rule._geometry(graph, node)
            found[node.inputs[0]] = (dims, layernorm_rule.centred(node))
    return found


def track_spreads(observers: dict, slices: dict) -> None:
    """Give the observers of ``slices``' values (:func:`slices_of`) a ``spread`` each, the
    narrowest slice they will see."""
    for name, (dims, centred) in slices.items():
        observers[name].spread = SliceSpread(dims, centred)


@dataclass
class NarrowNorm:
    node: str
    op: str
    value: str
    spread: float  # the narrowest slice's standard deviation (root mean square for L2Normalize)
    step: float  # of the input's 8-bit grid

    @property
    def codes(self) -> float:
        return self.spread / self.step

    def message(self, action: str) -> str:
        return (f"node '{self.node}' ({self.op}): its narrowest input slice spans {self.codes:.2g} steps of the 8-bit "
                f"grid of '{self.value}' (spread {self.spread:.3g}, step {self.step:.3g}); {action}")

    def to_dict(self) -> dict:
        return {"node": self.node, "value": self.value, "spread": self.spread, "step": self.step,
                "codes": round(self.codes, 3)}


def narrow_norms(graph, plan, observers: dict, params: dict, codes: float) -> list[NarrowNorm]:
    """Normalizations with an 8-bit input (``params``: the planned parameters) whose
    narrowest calibrated slice spans fewer than ``codes`` steps. ``codes`` <= 0 finds none."""
    found = []
    if codes <= 0:
        return found
    for node in graph.nodes:
        if plan.kinds.get(node.name) != "layernorm":
            continue
        name = node.inputs[0]
        tracker, p = getattr(observers.get(name), "spread", None), params.get(name)
        if tracker is None or p is None or p.dtype == "int16" or not tracker.smallest < float("inf"):
            continue
        step = float(p.scale)
        if tracker.smallest < codes * step:
            found.append(NarrowNorm(node.name, node.op, name, tracker.smallest, step))
    return found
