"""The pass manager: a registry of named passes, the default pipeline, and
:func:`optimize`, which runs passes in order on a copy of the graph, checks the
IR after every pass and optionally verifies the numerics against the
unoptimized graph on a seeded random batch.

A pass is a function ``fn(graph) -> int`` that rewrites ``graph`` in place and
returns how many rewrites it made (0: nothing to do). Passes are registered
with :func:`register_pass`; each lives in its own module.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import CheckError, NpuforgeError
from .rewrite import copy_graph

# Relative tolerance of --verify: max |optimized - reference| <= TOLERANCE * max |reference|, per output.
TOLERANCE = 1e-5


class UnknownPassError(NpuforgeError):
    """A pass name that is not registered."""


class PassFailedError(NpuforgeError):
    """A pass crashed, or left a graph that fails the checker."""

    def __init__(self, pass_name: str, message: str):
        self.pass_name = pass_name
        super().__init__(message)


class VerificationError(NpuforgeError):
    """A pass changed the graph's outputs beyond the tolerance."""

    def __init__(self, pass_name: str, message: str, report=None):
        self.pass_name = pass_name
        self.report = report
        super().__init__(message)


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Callable
    description: str


_PASSES: dict[str, PassInfo] = {}

# The default pipeline, in order. Why this order: constants first (the shape
# subgraphs of Pad/Reshape become constants), then removal of what is trivially
# redundant, so the structural folds (BN, Pad, bias, activation) see the real
# producer -> consumer pairs; pattern recognition before activation fusion so a
# Conv followed by a recognised Swish is left alone while Conv -> Relu fuses.
DEFAULT_PIPELINE = (
    "fold_constants",
    "div_by_constant",
    "remove_identity",
    "simplify_layout",
    "cse",
    "fold_batchnorm",
    "fold_pad",
    "fuse_bias",
    "recognize_activations",
    "recognize_normalizations",
    "fuse_activation",
    "dead_code",
)


def register_pass(name: str, description: str):
    """Decorator: register ``fn(graph) -> int`` under ``name``."""

    def deco(fn):
        if name in _PASSES and _PASSES[name].fn is not fn:
            raise RuntimeError(f"pass {name} registered twice")
        _PASSES[name] = PassInfo(name, fn, description)
        return fn

    return deco


def unregister_pass(name: str) -> None:
    """Remove a registered pass (for passes registered by tests or plugins)."""
    _PASSES.pop(name, None)


def _load_all() -> None:
    from . import (  # noqa: F401  (importing registers them)
        cse, dead_code, div_by_constant, fold_batchnorm, fold_constants, fold_pad, fuse_activation, fuse_bias,
        recognize_activations, recognize_normalizations, remove_identity, simplify_layout,
    )


def list_passes() -> list[str]:
    """Every registered pass: the default pipeline in order, then any others."""
    _load_all()
    extra = sorted(n for n in _PASSES if n not in DEFAULT_PIPELINE)
    return [n for n in DEFAULT_PIPELINE if n in _PASSES] + extra


def describe_passes() -> dict[str, str]:
    _load_all()
    return {n: _PASSES[n].description for n in list_passes()}


def get_pass(name: str) -> PassInfo:
    _load_all()
    if name not in _PASSES:
        close = difflib.get_close_matches(name, list(_PASSES), n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise UnknownPassError(f"unknown pass '{name}'{hint}; valid passes: {', '.join(list_passes())}")
    return _PASSES[name]


def resolve_passes(passes) -> list[str]:
    """None -> the default pipeline; "a,b" or ["a", "b"] -> validated names."""
    if passes is None:
        return list(DEFAULT_PIPELINE)
    if isinstance(passes, str):
        passes = [p.strip() for p in passes.split(",")]
    names = [p for p in passes if p]
    if not names:
        raise UnknownPassError(f"no pass given; valid passes: {', '.join(list_passes())}")
    for name in names:
        get_pass(name)
    return names


# -- report --------------------------------------------------------------------


@dataclass
class PassResult:
    name: str
    changes: int
    before: dict  # op histogram
    after: dict
    seconds: float
    max_rel_diff: float | None = None  # under verify: worst output's max |diff| / max |reference|

    @property
    def nodes_before(self) -> int:
        return sum(self.before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.after.values())

    def delta(self) -> dict:
        ops = sorted(set(self.before) | set(self.after))
        return {op: self.after.get(op, 0) - self.before.get(op, 0) for op in ops
                if self.after.get(op, 0) != self.before.get(op, 0)}


@dataclass
class OptimizeReport:
    graph_name: str
    before: dict
    after: dict = field(default_factory=dict)
    passes: list = field(default_factory=list)
    verified: bool = False

    def to_dict(self) -> dict:
        return {
            "graph": self.graph_name,
            "verified": self.verified,
            "tolerance": TOLERANCE if self.verified else None,
            "nodes_before": sum(self.before.values()),
            "nodes_after": sum(self.after.values()),
            "before": self.before,
            "after": self.after,
            "passes": [{"name": p.name, "changes": p.changes, "nodes_before": p.nodes_before,
                        "nodes_after": p.nodes_after, "before": p.before, "after": p.after,
                        "delta": p.delta(), "seconds": round(p.seconds, 4), "max_rel_diff": p.max_rel_diff}
                       for p in self.passes],
        }

    def format(self) -> str:
        """Per pass: node count before -> after and the per-op changes; then the
        op histogram before and after the whole pipeline."""
        lines = []
        width = max([len(p.name) for p in self.passes] + [4])
        for k, p in enumerate(self.passes, 1):
            delta = ", ".join(f"{op} {d:+d}" for op, d in p.delta().items()) or "no change"
            check = "" if p.max_rel_diff is None else f", verified (max rel diff {p.max_rel_diff:.2g})"
            lines.append(f"[{k}/{len(self.passes)}] {p.name:<{width}} {p.nodes_before:>5} -> {p.nodes_after:<5} "
                         f"nodes  {delta}  ({p.changes} rewrites, {p.seconds:.2f} s{check})")
        ops = sorted(set(self.before) | set(self.after))
        w = max([len(o) for o in ops] + [7])
        lines.append("")
        lines.append(f"{'op':<{w}}  before  after")
        for op in ops:
            lines.append(f"{op:<{w}}  {self.before.get(op, 0):>6}  {self.after.get(op, 0):>5}")
        lines.append(f"{'total':<{w}}  {sum(self.before.values()):>6}  {sum(self.after.values()):>5}")
        return "\n".join(lines)


# -- verification --------------------------------------------------------------


def random_feeds(graph, seed: int = 0, dynamic_dim: int = 2) -> dict:
    """Seeded random inputs from the graph's input shapes; symbolic dims set to ``dynamic_dim``."""
    from ..ir import dtypes

    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        v = graph.values[name]
        shape = [d if isinstance(d, int) else dynamic_dim for d in v.shape]
        np_dtype = dtypes.to_numpy(v.dtype)
        if np.issubdtype(np_dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(np_dtype)
        elif np_dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[name] = rng.integers(0, 4, shape).astype(np_dtype)
    return feeds


def compare_outputs(reference: dict, got: dict) -> tuple[float, str]:
    """(worst relative max abs diff over outputs, the output it was on); inf on a shape/dtype mismatch."""
    worst, where = 0.0, ""
    for name, ref in reference.items():
        out = got.get(name)
        if out is None or out.shape != ref.shape:
            return float("inf"), name
        if ref.dtype.kind not in "fc":
            diff = 0.0 if np.array_equal(out, ref) else float("inf")
        else:
            ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
            if not np.array_equal(np.isnan(ref64), np.isnan(out64)):
                return float("inf"), name
            ok = ~np.isnan(ref64)
            err = float(np.abs(out64[ok] - ref64[ok]).max()) if ok.any() else 0.0
            scale = float(np.abs(ref64[ok]).max()) if ok.any() else 0.0
            diff = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
        if diff > worst or not where:
            worst, where = max(worst, diff), name
    return worst, where


# -- the pipeline ----------------------------------------------------------------


def fingerprint(graph) -> tuple:
    """Cheap structural identity: nodes, outputs and which constant arrays are used.
    (Passes never write into a constant's array, so same arrays mean same data.)"""
    nodes = tuple((n.op, tuple(n.inputs), tuple(n.outputs), repr(sorted(n.attrs.items()))) for n in graph.nodes)
    consts = tuple(sorted((v.name, id(v.data)) for v in graph.constants()))
    return nodes, consts, tuple(graph.inputs), tuple(graph.outputs)


def run_pass(graph, name: str) -> int:
    """Run one registered pass in place on ``graph`` (no copy, no check)."""
    return get_pass(name).fn(graph)


def optimize(graph, passes=None, verify: bool = False, verify_batch: dict | None = None, seed: int = 0,
             tolerance: float = TOLERANCE, progress: Callable | None = None):
    """Optimize a copy of ``graph``; the caller's graph is left as it was.

    passes: None (the default pipeline, see :data:`DEFAULT_PIPELINE`), or pass
    names (a list or "a,b,c"). The checker runs after every pass. With
    ``verify``, every graph output after every pass is compared with the
    unoptimized graph's on ``verify_batch`` (feeds) or, by default, on seeded
    random inputs with symbolic dims set to 2; a pass whose change exceeds
    ``tolerance`` (relative to the output's max magnitude) raises
    :class:`VerificationError` naming it. ``progress(result)`` is called after
    every pass. Returns ``(optimized graph, OptimizeReport)``.
    """
    names = resolve_passes(passes)
    g = copy_graph(graph)
    report = OptimizeReport(graph.name, graph.op_histogram(), verified=verify)
    feeds = reference = None
    if verify:
        feeds = verify_batch if verify_batch is not None else random_feeds(graph, seed)
        reference = graph.run(feeds)
    last_diff, last_print = 0.0, fingerprint(g)
    for name in names:
        info = get_pass(name)
        before = g.op_histogram()
        start = time.perf_counter()
        try:
            changes = int(info.fn(g) or 0)
        except NpuforgeError as e:
            raise PassFailedError(name, f"pass '{name}' failed: {e}") from None
        except Exception as e:  # a bug in a pass: name it, keep the message one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise PassFailedError(name, f"pass '{name}' failed with {type(e).__name__}: {first}") from e
        seconds = time.perf_counter() - start
        try:
            g.check()
        except CheckError as e:
            raise PassFailedError(name, f"pass '{name}' left an invalid graph: {e}") from None
        result = PassResult(name, changes, before, g.op_histogram(), seconds)
        if verify and fingerprint(g) == last_print:
            result.max_rel_diff = last_diff  # nothing changed: the outputs are those of the last check
        elif verify:
            try:
                got = g.run(feeds)
            except Exception as e:  # NpuforgeError, or an executor bug on an unusual (valid) graph
                text = str(e).strip().splitlines()[0] if str(e).strip() else ""
                what = text if isinstance(e, NpuforgeError) else f"{type(e).__name__}: {text}"
                raise VerificationError(name, f"pass '{name}' broke the graph: running it fails: {what}",
                                        report) from None
            diff, where = compare_outputs(reference, got)
            result.max_rel_diff = last_diff = diff
            last_print = fingerprint(g)
            if not diff <= tolerance:
                report.passes.append(result)
                raise VerificationError(
                    name, f"pass '{name}' changed the numerics: output '{where}' differs from the unoptimized "
                          f"graph by {diff:.3g} of its magnitude (tolerance {tolerance:g}); run without it: "
                          f"--passes {','.join(n for n in names if n != name)}", report)
        report.passes.append(result)
        if progress is not None:
            progress(result)
    report.after = g.op_histogram()
    return g, report
