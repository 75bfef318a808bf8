"""Concat inputs whose ranges are too far apart to share one grid.

A Concat's inputs and output share one set of parameters (the integer op then
only moves codes). When one input spans [0, 480] (a detector's box coordinates)
and another [0, 1] (its sigmoid scores), the shared uint8 step of 1.88 rounds
every score to 0, silently. The quantizer finds such nodes from the calibrated
ranges, warns naming the node, the inputs and their ranges, and quantizes that
sharing group in int16 (a step of 0.0073 there), unless told not to.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MismatchedConcat:
    node: str
    ratio: float  # widest input range / narrowest
    wide: tuple  # (value name, lo, hi)
    narrow: tuple
    codes: float  # how many 8-bit codes of the shared grid the narrowest input spans

    def message(self, action: str) -> str:
        (wn, wl, wh), (nn, nl, nh) = self.wide, self.narrow
        return (f"node '{self.node}' (Concat): input ranges differ {self.ratio:.0f}x ('{wn}' [{wl:.4g}, {wh:.4g}], "
                f"'{nn}' [{nl:.4g}, {nh:.4g}]): one shared 8-bit grid leaves '{nn}' {self.codes:.1f} codes; {action}")

    def to_dict(self) -> dict:
        return {"node": self.node, "ratio": round(self.ratio, 2), "codes": round(self.codes, 2),
                "wide": list(self.wide), "narrow": list(self.narrow)}


def mismatched_concats(graph, plan, observers, ratio: float) -> list[MismatchedConcat]:
    """Concat nodes (quantization kind "concat") whose non-constant inputs' calibrated
    ranges, each widened to hold 0 as the quantizer does, differ by more than ``ratio``
    in width. ``ratio`` <= 0 finds none."""
    found = []
    if ratio <= 0:
        return found
    for node in graph.nodes:
        if plan.kinds.get(node.name) != "concat":
            continue
        ranges = []
        for name in node.inputs:
            if name in plan.activations:
                lo, hi = observers[name].range(255)
                ranges.append((name, min(float(lo), 0.0), max(float(hi), 0.0)))
        ranges = [r for r in ranges if r[2] > r[1]]
        if len(ranges) < 2:
            continue
        wide = max(ranges, key=lambda r: r[2] - r[1])
        narrow = min(ranges, key=lambda r: r[2] - r[1])
        r = (wide[2] - wide[1]) / (narrow[2] - narrow[1])
        if r > ratio:
            found.append(MismatchedConcat(node.name, r, wide, narrow, 255.0 / r))
    return found
