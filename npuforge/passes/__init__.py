"""Graph optimization passes and the pass manager.

    from npuforge.passes import optimize, list_passes
    optimized, report = optimize(graph)                 # the default pipeline, on a copy
    optimized, report = optimize(graph, passes="fold_constants,fold_pad", verify=True)
    print(report.format())

Each pass lives in its own module and registers itself with
:func:`register_pass`; ``optimize`` copies the graph first (the caller's graph
is never changed), runs the checker after every pass and, with ``verify``,
compares every output with the unoptimized graph after every pass.
"""

from .manager import (
    DEFAULT_PIPELINE, TOLERANCE, OptimizeReport, PassFailedError, PassResult, UnknownPassError, VerificationError,
    describe_passes, get_pass, list_passes, optimize, random_feeds, register_pass, resolve_passes, run_pass,
    unregister_pass,
)

__all__ = [
    "DEFAULT_PIPELINE", "TOLERANCE", "OptimizeReport", "PassFailedError", "PassResult", "UnknownPassError",
    "VerificationError", "describe_passes", "get_pass", "list_passes", "optimize", "random_feeds", "register_pass",
    "resolve_passes", "run_pass", "unregister_pass",
]
