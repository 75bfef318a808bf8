"""``npuforge quantize``: calibrate on a folder of images, quantize, write the
quantized IR and its ONNX QDQ file."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ..errors import NpuforgeError, UnsupportedError
from ..argtypes import positive_int
from ..outputs import ir_set
from ..workflow import add_preprocess_options
from .config import ACTIVATION_DTYPES, GRANULARITIES, QuantConfig
from .observers import METHODS


def add_quantize_parser(sub) -> None:
    p = sub.add_parser(
        "quantize", help="post-training int8 quantization calibrated on a folder of images",
        description="Optimize the model's graph, calibrate activation ranges on the first --num-calib images of "
                    "--calib (file order; with class subfolders, one image of each class in turn), quantize to "
                    "int8 and write the quantized IR at OUT (text + OUT.safetensors) and its ONNX QDQ form at OUT "
                    "with suffix .onnx. Under torchrun the calibration batches are shared out among the processes; "
                    "the files written are the same.")
    p.add_argument("model", help="an ONNX file, a float .tflite file, a saved npuforge IR, or a zoo model name (its "
                                 "weights and preprocessing are used)")
    p.add_argument("--calib", required=True, metavar="DIR", help="calibration images (class subfolders or "
                                                                  "ImageNet-style <wnid>_name.JPEG files), or "
                                                                  ".npy / .npz files of model inputs (token ids, "
                                                                  "audio, features: one sample or a batch each; "
                                                                  ".npz: one array per input name), or PCM .wav "
                                                                  "files for an audio model")
    p.add_argument("--class-table", metavar="TSV", help="class table for flat folders (index, wnid, name)")
    p.add_argument("--num-calib", type=int, default=100, metavar="N",
                   help="calibration images (default 100; with class subfolders, taken from each class in turn)")
    p.add_argument("--method", default="minmax", choices=METHODS, help="activation range observer (default minmax)")
    p.add_argument("--granularity", default="per-channel", choices=GRANULARITIES,
                   help="weight scales per output channel (default) or per tensor")
    p.add_argument("--activation-dtype", choices=ACTIVATION_DTYPES,
                   help="activation type (default uint8, asymmetric; int8 with --target tflite)")
    p.add_argument("--symmetric", action="store_true", help="symmetric activations")
    p.add_argument("--reduce-range", action="store_true",
                   help="7-bit weights, for ONNX Runtime's int8 kernels on x86 CPUs without VNNI")
    p.add_argument("--tflite-multipliers", action="store_true",
                   help="TFLite's integer arithmetic: multipliers normalized as TFLite stores them (two roundings "
                        "after a right shift; default: short right shifts folded in, one rounding) and TFLite's own "
                        "ADD, MEAN, pooling, FULLY_CONNECTED, SOFTMAX and activation kernels; needed by "
                        "`npuforge export --format tflite` (docs/tflite.md)")
    p.add_argument("--target", choices=("tflite",),
                   help="tflite: a quantized IR that `npuforge export --format tflite` always takes: implies "
                        "--tflite-multipliers and int8 activations, keeps int16 (a Concat of far-apart ranges, a "
                        "detector's box path) only where LiteRT's 16x8 kernels compute the same integers, and "
                        "rewrites what TFLite has no builtin for: a fused LeakyRelu, PRelu, LayerNormalization "
                        "(docs/tflite.md)")
    p.add_argument("--ort-multipliers", action=argparse.BooleanOptionalAction, default=None,
                   help="move each Conv / Gemm multiplier by at most 2^-18 of itself (more where a channel's outputs "
                        "stay small, never an output by more than 2^-10 of a code) to one ONNX Runtime's integer "
                        "convolution reproduces exactly: the integer simulator then runs almost every channel on "
                        "ONNX Runtime's int8 kernels (docs/simulator.md); on by default, except with "
                        "--tflite-multipliers / --target tflite; --no-ort-multipliers keeps the nearest multipliers")
    p.add_argument("--int16", default="", metavar="NAMES", help="comma-separated values or nodes kept at int16")
    p.add_argument("--keep-float", default="", metavar="NODES", help="comma-separated nodes kept in float")
    p.add_argument("--concat-range-ratio", type=float, default=16.0, metavar="R",
                   help="a Concat whose inputs' ranges differ more than R times (a detector's boxes and scores) "
                        "is quantized in int16, with a warning (default 16; 0 keeps every Concat in 8 bits)")
    p.add_argument("--norm-spread-codes", type=float, default=8.0, metavar="K",
                   help="a LayerNormalization / InstanceNormalization / L2Normalize whose narrowest input slice "
                        "(a ViT's class token) spreads over fewer than K steps of its 8-bit grid gets an int16 "
                        "input, with a warning (default 8; 0 keeps 8 bits)")
    p.add_argument("--equalize", action="store_true",
                   help="cross-layer equalization before calibration: rescale consecutive Conv/Gemm layers so "
                        "their channel ranges match (helps per-tensor weights most)")
    p.add_argument("--bias-correction", action="store_true",
                   help="remove each layer's mean output shift caused by quantization, measured on the "
                        "calibration images (holds them all in memory: about 1 GB per 100 at 224x224)")
    p.add_argument("--adaround", action="store_true",
                   help="learn each weight's rounding layer by layer on the calibration images (minutes)")
    p.add_argument("--adaround-iters", type=int, default=300, metavar="N",
                   help="AdaRound steps per layer (default 300)")
    p.add_argument("--no-adaround-bias-correction", dest="adaround_bias_correction", action="store_false",
                   help="leave the biases as they are while AdaRound learns (by default each layer's bias is "
                        "corrected right after its rounding, so later layers learn on corrected inputs)")
    p.add_argument("--adaround-cache", metavar="DIR",
                   help="where AdaRound keeps each learnt layer, so an interrupted run resumes "
                        "(default: OUT with suffix .adaround)")
    p.add_argument("--target-drop", type=float, metavar="D",
                   help="try recipes in order of cost (defaults; --equalize --bias-correction; with --adaround; "
                        "QAT) until one loses at most D points of top-1 against the float model on --held-out images "
                        "of --calib (spread over it; top-1 agreement when the folder has no labels of the model's "
                        "classes), and write that one; each rung's figure and time are printed")
    p.add_argument("--held-out", type=int, default=100, metavar="N",
                   help="with --target-drop: the images that score the rungs (default 100; the rest calibrate)")
    p.add_argument("--qat-epochs", type=positive_int, default=2, metavar="N",
                   help="with --target-drop: QAT epochs (default 2; QAT validates on a fifth of the "
                        "calibration images and starts from the better of the first two recipes there)")
    p.add_argument("--strict", action="store_true", help="an op with no quantization rule is an error")
    p.add_argument("--preprocess", metavar="ZOO_MODEL", help="use this zoo model's preprocessing for an ONNX file")
    add_preprocess_options(p)
    p.add_argument("--batch-size", type=positive_int, default=25, help="calibration batch size (default 25)")
    p.add_argument("--output", "-o", required=True, metavar="OUT", help="the quantized IR to write (e.g. q.nfir)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_quantize, outputs=lambda a: ir_set(a.output, qdq=True))


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def write_quantized(qgraph, out: Path) -> str:
    """The quantized IR at ``out``, its weights and its QDQ ONNX file beside it. Everything is
    written beside the target first, then renamed: a failure leaves no half-written set. A model
    with an op that has no ONNX form (MediaPipe's geometry ops) gets no QDQ file, and an older one
    at that name is removed (it would be another model's); -> what was written, for the report."""
    from .. import save
    from ..export import to_qdq_onnx

    try:
        qdq, why = to_qdq_onnx(qgraph), ""
    except UnsupportedError as e:
        qdq, why = None, str(e)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staged = Path(tmp) / out.name
        save(qgraph, staged)
        if qdq is not None:
            staged.with_suffix(".onnx").write_bytes(qdq.SerializeToString())
        for suffix in ("", ".safetensors", ".onnx"):
            src = staged.with_suffix(suffix) if suffix else staged
            if src.exists():
                os.replace(src, out.with_suffix(suffix) if suffix else out)
    if qdq is None:
        out.with_suffix(".onnx").unlink(missing_ok=True)
        return f"{out}, {out.with_suffix('.safetensors')} (no QDQ file: {why})"
    return f"{out}, {out.with_suffix('.safetensors')}, {out.with_suffix('.onnx')} (QDQ)"


def _climb(args, graph, dataset, config: QuantConfig, out: Path) -> int:
    """--target-drop: the recipe ladder (quant/ladder.py)."""
    from ..passes import optimize
    from ..workflow import stderr_log
    from .ladder import climb

    chosen = [flag for flag, on in (("--equalize", config.equalize), ("--bias-correction", config.bias_correction),
                                    ("--adaround", config.adaround)) if on]
    if chosen:
        raise NpuforgeError(f"--target-drop picks the recipe itself; drop {', '.join(chosen)}")
    if args.target_drop < 0:
        raise NpuforgeError(f"--target-drop {args.target_drop}: give a drop in points of top-1, 0 or more")
    qgraph, rows = climb(optimize(graph)[0], dataset, config, args.target_drop, held_out=args.held_out,
                         num_calib=args.num_calib, batch_size=args.batch_size, qat_epochs=args.qat_epochs,
                         log=stderr_log)
    written = write_quantized(qgraph, out)
    winner = next((r for r in rows if r["met"]), max(rows, key=lambda r: r["top1"]))
    if args.json:
        print(json.dumps({"model": args.model, "output": str(out), "target_drop": args.target_drop, "rungs": rows,
                          "chosen": winner["rung"]}, indent=2))
        return 0
    for r in rows:
        print(f"  {r['rung']:<40} {r['top1']:6.2f} %  drop {r['drop']:5.2f}  {r['seconds']:6.0f} s"
              + ("  <- meets the target" if r["met"] else ""))
    print(f"wrote {written}; the recipe: {winner['rung']}")
    return 0


def cmd_quantize(args) -> int:
    from tqdm import tqdm

    from ..arrays import array_files, batches as array_batches, read_samples
    from ..cli import parse_input_shapes
    from ..distributed import Distributed
    from ..workflow import check_input_size, preprocess_overrides, resolve_model, stderr_log, transform_of
    from ..zoo.data import ImageDataset, iter_batches
    from .quantize import quantize

    out = Path(args.output)
    if args.num_calib < 1:
        raise NpuforgeError(f"--num-calib {args.num_calib}: give a positive number of images")
    if args.target and args.ort_multipliers:
        raise NpuforgeError(f"--target {args.target} computes TFLite's integers; drop --ort-multipliers")
    dtype = args.activation_dtype or "uint8"  # (--target tflite makes it int8)
    config = QuantConfig(method=args.method, granularity=args.granularity, activation_dtype=dtype,
                         symmetric=args.symmetric, reduce_range=args.reduce_range, int16=_names(args.int16),
                         keep_float=_names(args.keep_float), concat_range_ratio=args.concat_range_ratio,
                         norm_spread_codes=args.norm_spread_codes, strict=args.strict, equalize=args.equalize,
                         tflite_multipliers=args.tflite_multipliers, ort_multipliers=args.ort_multipliers,
                         target=args.target or "",
                         bias_correction=args.bias_correction, adaround=args.adaround,
                         adaround_iters=args.adaround_iters, adaround_bias_correction=args.adaround_bias_correction,
                         adaround_cache=(args.adaround_cache or str(out.with_suffix(".adaround"))) if args.adaround
                         else "")
    log = stderr_log
    files = array_files(args.calib)  # .npy / .npz samples (token ids, audio, features) instead of photos
    graph = resolve_model(args.model, args.preprocess, log=log, input_shapes=parse_input_shapes(args.input_shape),
                          images=not files, overrides=preprocess_overrides(args))
    check_input_size(graph, args.model)
    for option, names in (("--int16", config.int16), ("--keep-float", config.keep_float)):
        unknown = sorted(set(names) - {n.name for n in graph.nodes} - set(graph.values))
        if unknown:  # before calibrating: a misspelt name would otherwise be found minutes later, or never
            raise NpuforgeError(f"{option}: {args.model} has no node or value named {', '.join(map(repr, unknown))}; "
                                f"give the model's own node or value names (as its file stores them)")
    hint = graph.metadata.get("detector", {}).get("int16", [])
    if hint and not args.int16:  # a detector's box path (its regressors reach far beyond the image)
        config.int16 = list(hint)
        log(f"note: {args.model}'s box path ({len(hint)} values, from its regressor convolutions to 'boxes') is "
            f"quantized in int16, as the detector records; --int16 NAMES chooses others")
    if files and args.target_drop is not None:
        raise NpuforgeError(f"--target-drop scores recipes on labelled photos; {args.calib} holds arrays")
    # calibration needs no labels (a detector's images have none); the target-drop climb evaluates on them
    dataset = None if files else ImageDataset(args.calib, args.class_table, option="--calib",
                                                labelled=args.target_drop is not None)
    dist = Distributed.from_env("cpu")
    if dist.active and (args.target_drop is not None or args.bias_correction or args.adaround):
        option = "--target-drop" if args.target_drop is not None else (
            "--bias-correction" if args.bias_correction else "--adaround")
        raise NpuforgeError(f"{option} runs in one process (torchrun shards plain calibration only); run it "
                            f"without torchrun")
    if args.target_drop is not None:
        return _climb(args, graph, dataset, config, out)
    samples = read_samples(graph, files, args.num_calib) if files else dataset.samples
    if len(samples) < args.num_calib:
        raise NpuforgeError(f"--calib {args.calib}: holds {len(samples)} {'samples' if files else 'images'} but "
                            f"--num-calib is {args.num_calib}; lower --num-calib or add some")
    batch = graph.values[graph.inputs[0]].shape[0]  # a static batch (a TFLite model's 1) sets the batch size
    batch = batch if isinstance(batch, int) else args.batch_size
    # under torchrun each process calibrates a consecutive run of whole batches: the batches, and so the
    # merged statistics, are one process's
    mine = dist.shard(-(-args.num_calib // batch))
    if files:
        batches = array_batches(samples[mine.start * batch:mine.stop * batch], batch)
        total = sum(len(next(iter(b.values()))) for b in batches)
    else:
        dataset.keep_first(args.num_calib)  # (class subfolders: every class in turn)
        dataset.samples = dataset.samples[mine.start * batch:mine.stop * batch]
        batches = (x for x, _, _ in iter_batches(dataset, transform_of(graph.metadata["preprocess"]), batch))
        total = len(dataset)
    bar = tqdm(total=total, desc="calibrating", unit="sample" if files else "img", file=sys.stderr,
               disable=args.quiet or args.json or not dist.main, leave=False)
    start = time.perf_counter()
    bars = {}

    def layer_progress(step: str, done: int, total: int) -> None:
        bar.close()
        if step not in bars:
            bars[step] = tqdm(total=total, desc=step, unit="layer", file=sys.stderr,
                              disable=args.quiet or args.json, leave=False)
        bars[step].update(done - bars[step].n)

    try:
        qgraph = quantize(graph, batches, config, progress=lambda n: bar.update(n - bar.n), log=log,
                          layer_progress=layer_progress, gather=dist.gather if dist.active else None)
    finally:
        for b in [bar, *bars.values()]:
            b.close()
    seconds = time.perf_counter() - start
    skipped = int(sum(dist.sum([len(dataset.skipped) if dataset is not None else 0])))
    if not dist.main:  # every process holds the same graph; the first writes and reports it
        dist.close()
        return 0
    written = write_quantized(qgraph, out)
    dist.close()
    meta = qgraph.metadata["quantization"]
    kinds: dict[str, int] = {}
    for n in qgraph.nodes:
        kind = "float" if n.name in meta["float_nodes"] else None
        if kind is None and any(qgraph.values[o].quant is not None for o in n.outputs):
            kind = n.op
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    summary = {
        "model": args.model, "output": str(out),
        "qdq_onnx": str(out.with_suffix(".onnx")) if out.with_suffix(".onnx").exists() else None,
        "weights": str(out.with_suffix(".safetensors")), "config": config.to_dict(),
        "calibration_images": meta["calibration_images"],
        "skipped_images": skipped, "seconds": round(seconds, 2), "processes": dist.world,
        "quantized_nodes": meta["quantized_nodes"], "float_nodes": meta["float_nodes"],
        **{step: meta[step] for step in ("equalize", "adaround", "bias_correction", "ort_multipliers")
           if step in meta},
        "quantized_values": sum(1 for v in qgraph.values.values() if v.quant is not None and not v.is_const),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"quantized {args.model}: {summary['quantized_nodes']} nodes in int8 "
          f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}), "
          f"{len(summary['float_nodes'])} kept in float")
    print(f"  {config.method} calibration on {summary['calibration_images']} images"
          f"{f' ({skipped} unreadable skipped)' if skipped else ''}"
          f"{f' in {dist.world} processes' if dist.active else ''}, "
          f"{config.granularity} weights, {config.activation_dtype} activations, {seconds:.1f} s")
    for step in ("equalize", "adaround", "bias_correction"):
        if step in meta:
            print(f"  {step.replace('_', ' ')}: " + ", ".join(f"{k} {v}" for k, v in meta[step].items()))
    if "ort_multipliers" in meta:
        r = meta["ort_multipliers"]
        print(f"  multipliers ONNX Runtime's integer convolution reproduces (the simulator's fast path): "
              f"{r['matched']} of {r['channels']} channels")
    print(f"  wrote {written}")
    return 0
