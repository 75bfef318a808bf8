"""Fixes tried on the worst layers, how much of the drop the ranking explains, and
the mixed-precision search.

Every candidate is a QuantConfig (plus per-value observer overrides) built from
the one cached calibration and scored by top-1 on the evaluation images.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from ..quant.config import QuantConfig

INT16_ENOUGH = 0.25  # int16 is the preferred fix when it removes >= 75 % of a layer's isolated output error


def with_changes(base: QuantConfig, changes: dict) -> QuantConfig:
    """``changes``: node -> "int16" | "float" | "per-channel"."""
    pick = lambda fix: [n for n, f in changes.items() if f == fix]  # noqa: E731
    return dataclasses.replace(base, int16=base.int16 + pick("int16"), keep_float=base.keep_float + pick("float"),
                               per_channel=base.per_channel + pick("per-channel"))


def program_key(graph) -> str:
    """A digest of what a quantized graph computes: its nodes (op, attributes, integer
    parameters), every value's quantization parameters and the constants' data. Two
    configurations that quantize alike (another observer on a Relu6 output, whose range is
    fixed) give the same key, so the program is scored once."""
    h = hashlib.sha256()
    for node in graph.nodes:
        h.update(repr((node.name, node.op, node.inputs, node.outputs, sorted(node.attrs.items()),
                       sorted(node.quant.items()))).encode())
    for name in sorted(graph.values):
        v = graph.values[name]
        h.update(repr((name, v.dtype, v.shape)).encode())
        if v.quant is not None:
            h.update(repr((v.quant.dtype, v.quant.axis)).encode())
            h.update(np.asarray(v.quant.scale).tobytes() + np.asarray(v.quant.zero_point).tobytes())
        if v.is_const and v.data is not None:
            h.update(np.ascontiguousarray(v.data).tobytes())
    return h.hexdigest()


class Scorer:
    """top-1 of configurations, each built once and each distinct program evaluated once."""

    def __init__(self, calibration, evaluator, base: QuantConfig, log=None):
        self.cal, self.ev, self.base, self.log = calibration, evaluator, base, log
        self.memo: dict = {}
        self.programs: dict = {}  # program_key -> top-1

    @staticmethod
    def key(changes: dict, methods: dict | None = None) -> tuple:
        return tuple(sorted(changes.items())), tuple(sorted((methods or {}).items()))

    def known(self, changes: dict) -> float | None:
        """The top-1 of ``changes`` if it was scored already, else None."""
        return self.memo.get(self.key(changes))

    def top1(self, changes: dict, methods: dict | None = None) -> float:
        key = self.key(changes, methods)
        if key not in self.memo:
            graph = self.cal.build(with_changes(self.base, changes), methods)
            program = program_key(graph)
            if program not in self.programs:
                self.programs[program] = self.ev.top1(graph)
            self.memo[key] = self.programs[program]
            if self.log:
                what = ", ".join(f"{n} {f}" for n, f in sorted(changes.items())) or "all int8"
                extra = f" observers {methods}" if methods else ""
                self.log(f"  evaluated {what}{extra}: top-1 {self.memo[key]:.2f}%")
        return self.memo[key]


def best_observer(layer, base_method: str) -> str | None:
    """The other observer method with the least isolated error at the layer's output."""
    options = {label.split(":", 1)[1]: s.noise for label, s in layer.variants.items() if label.startswith("observer:")}
    options.pop(base_method, None)
    return min(options, key=options.get) if options else None


def preferred_fix(layer) -> str:
    """int16 when widening the output removes most of the layer's isolated error, else float."""
    wide = layer.variants.get("int16")
    if wide is not None and layer.isolated.noise > 0 and wide.noise <= INT16_ENOUGH * layer.isolated.noise:
        return "int16"
    return "float"


def try_fixes(scorer: Scorer, layer, int8_top1: float) -> list[dict]:
    base = scorer.base
    trials = []
    if layer.kind == "compute" and base.granularity == "per-tensor":
        trials.append(("per-channel weights", {layer.node: "per-channel"}, None))
    method = best_observer(layer, base.method)
    if method:
        trials.append((f"{method} observer", {}, {layer.output: method}))
    trials.append(("int16 activations", {layer.node: "int16"}, None))
    trials.append(("keep in float", {layer.node: "float"}, None))
    out = []
    for label, changes, methods in trials:
        top1 = scorer.top1(changes, methods)
        out.append({"layer": layer.node, "fix": label, "top1": round(top1, 3), "delta": round(top1 - int8_top1, 3)})
    return out


def explain(scorer: Scorer, ranked: list, fp32: float, int8: float, counts=(1, 2, 3, 5, 10)) -> list[dict]:
    """top-1 with the n worst-ranked layers kept in float, and the share of the drop recovered."""
    drop = fp32 - int8
    out = []
    for n in [c for c in counts if c <= len(ranked)]:
        top1 = scorer.top1({layer.node: "float" for layer in ranked[:n]})
        out.append({"layers": n, "top1": round(top1, 3),
                    "recovered": round((top1 - int8) / drop, 3) if drop > 0 else None,
                    "output_noise_share": round(sum(layer.share for layer in ranked[:n]), 4)})
    return out


def search(scorer: Scorer, ranked: list, fp32: float, int8: float, target_drop: float, max_layers: int = 16,
           log=None) -> dict:
    """The fewest int16 / float layers that bring top-1 within ``target_drop`` of FP32.

    Candidates are the ``max_layers`` worst-ranked layers, each with its preferred fix
    (int16 when that removes most of its isolated error, else float). A binary search
    finds the shortest prefix of the ranking that reaches the goal; then each chosen
    layer is dropped when the goal holds without it, and each float layer tried in int16.
    Prefixes already scored (``explain``'s worst layers in float, when those are the
    preferred fixes) bound the binary search before anything new is evaluated.
    """
    goal = fp32 - target_drop
    result = {"target_drop": target_drop, "goal_top1": round(goal, 3), "fp32_top1": round(fp32, 3)}
    if int8 >= goal:
        return {**result, "reached": True, "changes": {}, "top1": round(int8, 3), "evaluations": 0}
    before = len(scorer.memo)
    cand = ranked[:max_layers]
    prefer = {layer.node: preferred_fix(layer) for layer in cand}
    prefix = lambda n: {layer.node: prefer[layer.node] for layer in cand[:n]}  # noqa: E731 (prefer as it is now)
    ok = lambda changes: scorer.top1(changes) >= goal  # noqa: E731
    known = {n: scorer.known(prefix(n)) for n in range(1, len(cand) + 1)}
    known = {n: top1 for n, top1 in known.items() if top1 is not None}
    reaching = [n for n, top1 in known.items() if top1 >= goal]
    if reaching:  # prefix hi is known to reach the goal: no need to score the whole candidate list
        hi = min(reaching)
        lo = max((n for n, top1 in known.items() if n < hi), default=0)
    else:
        if not ok(prefix(len(cand))):
            prefer = {layer.node: "float" for layer in cand}
            if not ok(prefix(len(cand))):
                best = prefix(len(cand))
                return {**result, "reached": False, "changes": best, "top1": round(scorer.top1(best), 3),
                        "evaluations": len(scorer.memo) - before}
        lo, hi = 0, len(cand)  # prefix lo fails (or is empty), prefix hi reaches the goal
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(prefix(mid)):
            hi = mid
        else:
            lo = mid
    chosen = prefix(hi)
    for node in list(reversed(chosen)):  # least harmful first
        trial = {n: f for n, f in chosen.items() if n != node}
        if trial and ok(trial):
            chosen = trial
    for node, fix in list(chosen.items()):
        if fix == "float":
            trial = {**chosen, node: "int16"}
            if ok(trial):
                chosen = trial
    return {**result, "reached": True, "changes": chosen, "top1": round(scorer.top1(chosen), 3),
            "evaluations": len(scorer.memo) - before}
