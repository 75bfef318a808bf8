"""``npuforge analyze``: where a quantized model loses accuracy, and what fixes it."""

from __future__ import annotations

import json
from pathlib import Path

from ..argtypes import positive_int
from ..errors import NpuforgeError
from ..workflow import add_preprocess_options


def add_analyze_parser(sub) -> None:
    from ..quant.config import ACTIVATION_DTYPES, GRANULARITIES
    from ..quant.observers import METHODS

    p = sub.add_parser(
        "analyze", help="per-layer quantization error, worst-layer ranking, fixes, mixed-precision search, report",
        description="Calibrate on the first --num-calib images of --calib, quantize, and explain the accuracy "
                    "drop on --data: per-layer error (cumulative and isolated: SQNR, cosine, relative MSE), a "
                    "ranking of the layers by their share of the network-output error, fixes tried on the worst "
                    "layers (per-channel weights, another observer, int16, float) with their top-1, and with "
                    "--target-drop a mixed-precision search for the fewest int16 / float layers. When --data is "
                    "the --calib folder, evaluation skips the calibration images.")
    p.add_argument("model", help="an ONNX file, a float .tflite file, a saved float npuforge IR, or a zoo model name")
    p.add_argument("--calib", required=True, metavar="DIR", help="calibration images (file order)")
    p.add_argument("--data", required=True, metavar="DIR", help="evaluation images (labelled)")
    p.add_argument("--class-table", metavar="TSV", help="class table for flat folders (index, wnid, name)")
    p.add_argument("--num-calib", type=int, default=100, metavar="N", help="calibration images (default 100)")
    p.add_argument("--skip", type=int, metavar="N", help="leave out the first N images of --data (default: "
                                                         "--num-calib when --data is --calib, else 0)")
    p.add_argument("--limit", type=int, metavar="N", help="evaluate at most N images")
    p.add_argument("--method", default="minmax", choices=METHODS, help="activation observer (default minmax)")
    p.add_argument("--granularity", default="per-channel", choices=GRANULARITIES, help="weight scales")
    p.add_argument("--activation-dtype", default="uint8", choices=ACTIVATION_DTYPES)
    p.add_argument("--symmetric", action="store_true", help="symmetric activations")
    p.add_argument("--analysis-images", type=int, default=16, metavar="N",
                   help="evaluation images for the per-layer errors (default 16)")
    p.add_argument("--fix-layers", type=int, default=3, metavar="N",
                   help="worst layers on which fixes are tried (default 3)")
    p.add_argument("--target-drop", type=float, metavar="D",
                   help="search the fewest int16 / float layers that bring top-1 within D points of FP32")
    p.add_argument("--max-layers", type=int, default=16, metavar="N", help="search among the N worst layers")
    p.add_argument("--engine", default="int", choices=("int", "ort", "npuforge"),
                   help="who computes top-1 while analysing: int (the integer program on the simulator's fast "
                        "exact path, as npuforge eval --engine int; default), ort (QDQ in ONNX Runtime with graph "
                        "optimizations off: the fake-quant numbers up to float rounding; 2-4x slower) or npuforge "
                        "(fake-quant)")
    p.add_argument("--output", "-o", metavar="OUT.nfir", help="write the quantized model the search chose "
                                                              "(or plain int8 without --target-drop)")
    p.add_argument("--remedies", default="equalize,equalize+bias_correction", metavar="LIST",
                   help="whole-model steps of npuforge quantize to measure: comma-separated, each a '+'-joined "
                        "set of equalize, bias_correction, adaround (default: equalize,equalize+bias_correction; "
                        "'none' for none)")
    p.add_argument("--report", metavar="HTML", help="write a self-contained HTML report")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows of the ranked table (default 15)")
    p.add_argument("--preprocess", metavar="ZOO_MODEL", help="use this zoo model's preprocessing for an ONNX file")
    add_preprocess_options(p)
    p.add_argument("--batch-size", type=positive_int, default=25, help="batch size for loading images (default 25)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (one entry per layer)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_analyze, outputs=_planned)


def _planned(args):
    from ..outputs import Planned, ir_set

    return (ir_set(args.output, qdq=True) if args.output else []) + (
        [Planned(Path(args.report), "text", "--report")] if args.report else [])


def _load_images(dataset, transform, batch_size):
    import numpy as np

    from ..zoo.data import iter_batches

    xs, ys = [], []
    for x, y, _ in iter_batches(dataset, transform, batch_size):
        xs.append(x)
        ys.append(y)
    if not xs:
        raise NpuforgeError(f"{dataset.root}: none of the {len(dataset)} images could be read")
    return np.concatenate(xs), np.concatenate(ys)


def _check(args) -> None:
    for name in ("num_calib", "analysis_images", "fix_layers", "max_layers", "batch_size"):
        value = getattr(args, name)
        if value < (0 if name == "fix_layers" else 1):
            raise NpuforgeError(f"--{name.replace('_', '-')} {value}: give a positive number")
    if args.target_drop is not None and args.target_drop < 0:
        raise NpuforgeError(f"--target-drop {args.target_drop}: give a drop in points >= 0")


def _remedies(text: str) -> tuple:
    from .analyze import REMEDIES

    if text.strip() == "none":
        return ()
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        steps = tuple(s.strip() for s in item.split("+"))
        bad = [s for s in steps if s not in REMEDIES]
        if bad:
            raise NpuforgeError(f"--remedies {text}: '{bad[0]}' is not one of {', '.join(REMEDIES)}")
        out.append(steps)
    return tuple(out)


def cmd_analyze(args) -> int:
    from ..quant.config import QuantConfig
    from ..cli import parse_input_shapes
    from ..workflow import batch_size_for, preprocess_overrides, resolve_model, stderr_log, transform_of
    from ..zoo.data import ImageDataset
    from .analyze import analyze
    from .text import format_table

    _check(args)
    remedies = _remedies(args.remedies)
    log = (lambda m: None) if args.quiet else stderr_log  # on stderr: --json output stays clean
    config = QuantConfig(method=args.method, granularity=args.granularity, activation_dtype=args.activation_dtype,
                         symmetric=args.symmetric)
    graph = resolve_model(args.model, args.preprocess, log=stderr_log,
                          input_shapes=parse_input_shapes(args.input_shape), overrides=preprocess_overrides(args))
    if any(v.quant is not None for v in graph.values.values()):
        raise NpuforgeError(f"{args.model}: already quantized; analyze takes the float model")
    transform = transform_of(graph.metadata["preprocess"])
    calib = ImageDataset(args.calib, args.class_table, labelled=False, option="--calib")
    if len(calib) < args.num_calib:
        raise NpuforgeError(f"--calib {args.calib}: holds {len(calib)} images but --num-calib is {args.num_calib}")
    calib.samples = calib.samples[:args.num_calib]
    same = Path(args.calib).resolve() == Path(args.data).resolve()
    skip = args.skip if args.skip is not None else (args.num_calib if same else 0)
    if same and skip < args.num_calib:
        log(f"note: --data is the calibration folder and --skip {skip} keeps calibration images in the evaluation")
    data = ImageDataset(args.data, args.class_table, limit=args.limit, skip=skip)
    batch_size = batch_size_for(graph, args.batch_size, "analyze", log)
    x_calib, _ = _load_images(calib, transform, batch_size)
    batches = [x_calib[i:i + batch_size] for i in range(0, len(x_calib), batch_size)]
    x_eval, y_eval = _load_images(data, transform, batch_size)
    log(f"{args.model}: {len(x_calib)} calibration images, {len(x_eval)} evaluation images"
        f"{f' (first {skip} of --data skipped)' if skip else ''}")
    result, qgraph = analyze(graph, batches, x_eval, y_eval, config, analysis_images=args.analysis_images,
                             fix_layers=args.fix_layers, target_drop=args.target_drop, max_layers=args.max_layers,
                             engine=args.engine, log=log, remedies=remedies, batch_size=batch_size)
    result["model"] = args.model
    result["calib"], result["data"], result["skip"] = str(args.calib), str(args.data), skip
    if args.output:
        from ..quant.cli import write_quantized

        write_quantized(qgraph, Path(args.output))
        result["written"] = str(args.output)
    if args.report:
        from .report import write_report

        write_report(result, Path(args.report))
        result["report"] = str(args.report)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result, args.top))
    return 0
