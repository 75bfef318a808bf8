"""``npuforge optimize``: run the optimization pipeline on a model and save the IR.

    npuforge optimize MODEL --output OUT [--passes a,b,c] [--verify] [--seed S] [--json]

Prints, per pass, the node count before -> after with the per-op changes, then
the op histogram before and after. Writes the optimized IR with
``npuforge.save`` (OUT plus OUT's .safetensors beside it), only when every pass
succeeded (and, under --verify, kept the outputs within tolerance); the two
files are written beside OUT first and renamed into place, so a failure never
leaves half a model. User errors raise NpuforgeError (``npuforge: error: ...``,
exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import NpuforgeError
from ..outputs import ir_set


def _save_atomically(graph, out: Path) -> None:
    from .. import save
    from ..ir.textio import weights_path

    out.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(dir=out.parent, prefix=".npuforge-optimize-"))
    try:
        tmp = tmpdir / out.name
        save(graph, tmp)
        os.replace(weights_path(tmp), weights_path(out))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def cmd_optimize(args) -> int:
    from .. import load
    from ..cli import parse_input_shapes
    from ..ir.textio import weights_path
    from .manager import list_passes, optimize, resolve_passes

    if args.list:
        from .manager import describe_passes

        for name, text in describe_passes().items():
            print(f"{name:<22} {text}")
        return 0
    if not args.model or not args.output:
        raise NpuforgeError("optimize needs MODEL and --output OUT (or --list to list the passes)")
    passes = resolve_passes(args.passes) if args.passes is not None else None  # unknown names fail first
    out = Path(args.output)
    graph = load(args.model, input_shapes=parse_input_shapes(args.input_shape))

    def progress(result):
        if args.json or args.quiet:
            return
        delta = ", ".join(f"{op} {d:+d}" for op, d in result.delta().items()) or "no change"
        check = "" if result.max_rel_diff is None else f"; max rel diff {result.max_rel_diff:.2g}"
        print(f"  {result.name:<24} {result.nodes_before:>5} -> {result.nodes_after:<5} nodes  {delta}  "
              f"({result.changes} rewrites{check})", flush=True)

    if not args.json and not args.quiet:
        names = passes or list_passes()
        print(f"{args.model}: {len(graph.nodes)} nodes; passes: {', '.join(n for n in names)}"
              f"{' (verified on a seeded random batch)' if args.verify else ''}")
    optimized, report = optimize(graph, passes=passes, verify=args.verify, seed=args.seed, progress=progress)
    _save_atomically(optimized, out)
    if args.json:
        data = report.to_dict()
        data["output"] = str(out)
        data["weights"] = str(weights_path(out))
        print(json.dumps(data, indent=2))
    elif not args.quiet:
        lines = report.format().split("\n\n", 1)
        print()
        print(lines[1] if len(lines) > 1 else lines[0])
        print(f"wrote {out} and {weights_path(out)}")
    return 0


def add_optimize_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "optimize", help="fold, fuse and simplify a model's graph for int8 deployment",
        description="Run the graph optimizer (constant folding, BatchNorm/Pad/bias folding, activation fusion "
                    "and recognition, elimination of redundant nodes) on a model and save the optimized IR. "
                    "The IR checker runs after every pass; --verify also compares every output with the "
                    "unoptimized model after every pass and fails (exit 2, nothing written) naming the pass "
                    "that changed them beyond 1e-5 of their magnitude.")
    p.add_argument("model", nargs="?", help="an ONNX file, a .tflite file or a saved npuforge IR")
    p.add_argument("--output", "-o", metavar="OUT", help="where to write the optimized IR (text; weights beside it "
                                                         "with suffix .safetensors)")
    p.add_argument("--passes", metavar="A,B,C", help="comma-separated passes to run in this order "
                                                     "(default: the whole pipeline; see --list)")
    p.add_argument("--verify", action="store_true",
                   help="check the outputs after every pass on a seeded random batch (dynamic dims set to 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --verify batch (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    p.add_argument("--list", action="store_true", help="list the passes in pipeline order and exit")
    p.set_defaults(func=cmd_optimize, outputs=lambda a: ir_set(a.output) if a.output else [])


if __name__ == "__main__":  # pragma: no cover
    from ..cli import main

    sys.exit(main(["optimize", *sys.argv[1:]]))
