"""The ``npuforge`` command.

Each subcommand is a small function; user errors (NpuforgeError) print one line
``npuforge: error: ...`` and exit 2 with no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from .argtypes import positive_int
from .errors import CheckError, NpuforgeError
from .outputs import Planned, add_force_option, check_outputs, input_files
from .workflow import add_preprocess_options


class InputValueSpec(str):
    """An ``--input-value`` spec: it goes into ``--input-shape``'s list (the same ``args.input_shape``), so
    that every command's ``parse_input_shapes(args.input_shape)`` reads both."""


def _parse_input_value(spec: str):
    """``NAME=V[,V...]`` -> (name, NumPy array): int64 when every value is an integer, else float64."""
    import numpy as np

    name, _, text = spec.rpartition("=")
    if not text.strip():
        raise NpuforgeError(f"--input-value {spec}: write NAME=V[,V...] (e.g. sr=16000)")
    values = []
    for t in text.split(","):
        t = t.strip()
        try:
            values.append(int(t))
        except ValueError:
            try:
                values.append(float(t))
            except ValueError:
                raise NpuforgeError(f"--input-value {spec}: {t!r} is not a number; write NAME=V[,V...] "
                                    f"(e.g. sr=16000)") from None
    ints = all(isinstance(v, int) for v in values)
    if ints and any(not -2**63 <= v < 2**63 for v in values):
        raise NpuforgeError(f"--input-value {spec}: a value is out of the int64 range")
    return name, np.array(values, np.int64 if ints else np.float64)


def parse_input_shapes(specs: list[str] | None, values: list[str] | None = None) -> dict:
    """``--input-shape NAME=1,3,640,640`` (repeatable; NAME= may be left out for a
    one-input model; a non-numeric dim such as N stays symbolic, -1 keeps the model's
    dim) -> {name: dims}; ``--input-value NAME=V[,V...]`` (an :class:`InputValueSpec` in
    ``specs``, or a spec in ``values``) -> {name: NumPy array}, the input fixed to that value
    at import (see :func:`npuforge.load`)."""
    shapes = {}
    fixed = {}
    for spec in list(specs or []) + [InputValueSpec(v) for v in values or []]:
        if isinstance(spec, InputValueSpec):
            name, value = _parse_input_value(spec)
            fixed[name] = value
            continue
        name, _, dims = spec.rpartition("=")
        shape = tuple(int(d) if d.strip().lstrip("-").isdigit() else d.strip() for d in dims.split(","))
        if not dims or any(d == "" or (isinstance(d, int) and d <= 0 and d != -1) for d in shape):
            raise NpuforgeError(f"--input-shape {spec}: write NAME=D1,D2,... with positive sizes, -1 to keep the "
                                f"model's dim, or a name such as N to keep it dynamic (e.g. images=1,3,640,640)")
        shapes[name] = shape
    for name in fixed:
        if name in shapes:
            raise NpuforgeError(f"--input-value {name or '(no NAME=)'}: the input has an --input-shape too; its "
                                f"value fixes its shape, give one or the other")
    return {**shapes, **fixed}


def add_input_shape_option(parser) -> None:
    parser.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                        help="fix an ONNX model's dynamic input sizes, e.g. images=1,3,640,640 (repeat for "
                             "several inputs; NAME= may be left out for a one-input model; a name such as N "
                             "keeps that dim dynamic, -1 keeps the model's dim)")
    parser.add_argument("--input-value", action="append", dest="input_shape", type=InputValueSpec,
                        metavar="NAME=V[,V...]",
                        help="fix an ONNX model's input to a constant value, such as a sample rate (sr=16000), "
                             "so that the If / Loop branches that depend on it fold at import (repeatable; the "
                             "input leaves the model's inputs)")


def _load(args):
    from . import load

    return load(args.model, input_shapes=parse_input_shapes(args.input_shape))


def refuse_program(path) -> None:
    """An NPU program (``NPUB`` magic or an .npub name) is not a model: say so, rather than call it a
    corrupt ONNX file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return  # the loader says what is wrong with the path
    if head == b"NPUB" or path.suffix.lower() == ".npub":
        raise NpuforgeError(f"{path}: an NPU program (.npub), not a model; run it with `npuforge run {path} "
                            f"--input x.npy`")


def cmd_inspect(args) -> int:
    from .ir.summary import format_summary, summarize

    refuse_program(args.model)
    summary = summarize(_load(args))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def cmd_check(args) -> int:
    from . import refuse_input_shapes_for_ir
    from .ir import textio
    from .ir.textio import MAGIC
    from .frontend.onnx_importer import import_onnx

    path = Path(args.model)
    if not path.is_file():
        raise NpuforgeError(f"{path}: no such file")
    refuse_program(path)
    with open(path, "rb") as f:
        head = f.read(max(len(MAGIC), 8))
    is_ir = head[:len(MAGIC)] == MAGIC.encode()
    try:
        shapes = parse_input_shapes(args.input_shape)
        if is_ir:
            refuse_input_shapes_for_ir(path, shapes)
            graph = textio.load(path)
        elif head[4:8] == b"TFL3" or path.suffix.lower() == ".tflite":
            from . import load

            graph = load(path, input_shapes=shapes)  # the TFLite importer
        else:
            graph = import_onnx(path, input_shapes=shapes)
        graph.check()
    except CheckError as e:
        for problem in e.problems:
            print(f"{path}: {problem}")
        print(f"{path}: {len(e.problems)} problem(s)")
        return 1
    print(f"{path}: ok ({len(graph.nodes)} nodes, {len(graph.values)} values)")
    return 0


def parse_inputs(names: list, specs: list[str], what: str = "graph", read=None) -> dict:
    """``--input NAME=FILE`` specs -> {input name: array}; NAME= may be left out for one input.
    ``read(file)`` may return an array for files it knows (an .npub program's images), else None:
    the file is read as .npy."""
    import numpy as np

    feeds = {}
    for spec in specs:
        name, sep, file = spec.rpartition("=")
        if not sep:
            if len(names) != 1:
                raise NpuforgeError(f"--input {spec}: the {what} has {len(names)} inputs; write NAME=FILE.npy")
            name, file = names[0], spec
        if name not in names:
            raise NpuforgeError(f"--input {spec}: the {what} has no input '{name}' (its inputs: {', '.join(names)})")
        arr = read(file) if read else None
        if arr is not None:
            feeds[name] = arr
            continue
        from .zoo.data import IMAGE_EXTENSIONS

        if Path(file).suffix.lower() in IMAGE_EXTENSIONS:
            raise NpuforgeError(f"--input {spec}: an image; `npuforge run` reads images only for an .npub program "
                                f"(which records its preprocessing): give this {what} a preprocessed .npy array, or "
                                f"classify images with `npuforge eval`")
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            reason = "not a .npy file" if "pickled" in str(e) or "magic" in str(e).lower() else str(e)
            raise NpuforgeError(f"--input {spec}: cannot read {file} as .npy ({reason})") from None
    return feeds


SIM_ENGINE_HELP = ("who runs the integer program: auto (default: ort where every node lowers, else plain), ort "
                   "(lowered to one ONNX Runtime graph, proven bit-exact node by node when built; much faster), "
                   "plain (the reference torch simulator) or fast (as auto, with nodes kept in float lowered too: "
                   "ONNX Runtime's float kernels there, equal to plain up to float summation order)")


def cmd_run(args) -> int:
    import io

    import numpy as np

    from .fileio import write_atomic

    program = str(args.model).endswith(".npub")
    if program:
        from .compiler.cli import run_program

        results = run_program(args)
    else:
        graph = _load(args)
        feeds = parse_inputs(graph.inputs, args.input)
        if args.mode == "float":
            results = graph.run(feeds)
        elif args.mode == "fake":
            from .sim.fake_quant import run_fake_quant

            results = run_fake_quant(graph, feeds)
        else:
            from .sim.lowered import make_simulator

            results = make_simulator(graph, args.rounding, args.sim_engine).run(feeds, dequantize=not args.codes)
    for name, arr in results.items():
        stats = f"min {arr.min():.6g} max {arr.max():.6g}" if arr.size and arr.dtype.kind in "fiu" else ""
        if program and arr.ndim == 2 and arr.shape[0] == 1 and arr.shape[1] > 1:  # a classifier's scores
            stats += "; top-5 " + ", ".join(str(int(i)) for i in np.argsort(-arr[0], kind="stable")[:5])
        print(f"{name}: {arr.dtype}{list(arr.shape)} {stats}")
    if args.output:
        buf = io.BytesIO()
        np.savez(buf, **results)
        write_atomic(Path(args.output), buf.getvalue())  # a failed run never leaves half a file
        print(f"wrote {args.output}")
    return 0


def cmd_ops(args) -> int:
    from .ops import all_ops

    ops = all_ops()
    if args.json:
        print(json.dumps({name: {"inputs": list(op.inputs), "outputs": list(op.outputs), "attrs": sorted(op.attrs),
                                 "quant": op.quant, "summary": op.summary} for name, op in ops.items()}, indent=2))
        return 0
    width = max(len(n) for n in ops)
    kinds = {name: op.quant or "float" for name, op in ops.items()}
    kwidth = max(len(k) for k in kinds.values())
    print(f"{'op':<{width}}  {'int8 rule':<{kwidth}}  semantics")
    for name, op in ops.items():
        print(f"{name:<{width}}  {kinds[name]:<{kwidth}}  {op.summary}")
    counts = {}
    for k in kinds.values():
        counts[k] = counts.get(k, 0) + 1
    print(f"{len(ops)} ops ({', '.join(f'{k} {n}' for k, n in sorted(counts.items()))}; float: kept in float when "
          f"quantizing; docs/quantization.md explains each rule)")
    print("also imported from ONNX, as the ops above: If and Loop (folded at import when what decides them is "
          "known), LSTM, GRU and RNN (unrolled over the sequence length)")
    return 0


def cmd_eval(args) -> int:
    if args.task == "detection":
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise NpuforgeError("--task detection runs in one process (torchrun shares out classification only); "
                                "run it without torchrun")
        from .detection.cli import eval_detection

        return eval_detection(args)
    from .arrays import ArrayDataset, labelled_array_folders
    from .distributed import Distributed
    from .workflow import (batch_size_for, check_input_size, forward_of, plain_fallback_note, preprocess_overrides,
                           resolve_model, stderr_log, transform_of)
    from .zoo.data import ImageDataset
    from .zoo.evaluate import evaluate_logits

    path = Path(args.model)
    onnx_file = path.suffix == ".onnx" and path.is_file()
    arrays = labelled_array_folders(args.data)  # class subfolders of .npy / .npz / .wav inputs, not photos
    if onnx_file and args.engine == "ort" and not arrays:
        # run the file as it is (a QDQ model included); only its metadata is read here
        import onnx

        from .ir.graph import Graph
        from .workflow import preprocess_of

        proto = onnx.load(str(path), load_external_data=False)
        meta = next((p.value for p in proto.metadata_props if p.key == "npuforge"), "{}")
        try:
            meta = json.loads(meta)
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            raise NpuforgeError(f"{path}: its 'npuforge' metadata is not a JSON object; re-export the file")
        graph = Graph(path.stem)
        if args.preprocess:
            from .zoo import get_config

            meta["preprocess"] = preprocess_of(get_config(args.preprocess))
        if "preprocess" not in meta:
            raise NpuforgeError(f"{path}: records no preprocessing; give --preprocess ZOO_MODEL")
        graph.metadata = meta
        forward = forward_of(graph, "ort", onnx_path=path)
    else:
        graph = resolve_model(args.model, args.preprocess, log=stderr_log,
                              input_shapes=parse_input_shapes(args.input_shape), images=not arrays,
                              overrides=preprocess_overrides(args))
        check_input_size(graph, args.model)
        args.batch_size = batch_size_for(graph, args.batch_size, args.model, None if args.json else stderr_log)
        forward = forward_of(graph, args.engine, sim_engine=args.sim_engine)
        why = getattr(forward, "fallback", None)
        if why and not args.json:
            stderr_log(plain_fallback_note(why))
    table = args.class_table
    if table is None and "class_table" in graph.metadata:  # a training run's classes
        from .zoo.data import ClassTable

        ct = graph.metadata["class_table"]
        if not (isinstance(ct, dict) and all(isinstance(ct.get(k), list) and all(isinstance(x, str) for x in ct[k])
                                             for k in ("wnids", "names")) and len(ct["wnids"]) == len(ct["names"])):
            raise NpuforgeError(f"{args.model}: its recorded class_table is not two equal lists of strings "
                                f"(wnids, names); give --class-table FILE")
        table = ClassTable(tuple(ct["wnids"]), tuple(ct["names"]), source=args.model)
    if arrays:
        dataset = ArrayDataset(args.data, graph, limit=args.limit, skip=args.skip)
    else:
        dataset = ImageDataset(args.data, table, limit=args.limit, skip=args.skip)
    dist = Distributed.from_env("cpu")  # under torchrun: each process a consecutive share of the images
    dataset.samples = [dataset.samples[i] for i in dist.shard(len(dataset.samples))]
    if args.engine == "ort" and "quantization" in graph.metadata and not args.json:
        from .workflow import ORT_VNNI_NOTE, cpu_lacks_vnni

        if cpu_lacks_vnni() and not graph.metadata["quantization"]["config"].get("reduce_range"):
            stderr_log(ORT_VNNI_NOTE)
    transform = (lambda sample: sample) if arrays else transform_of(graph.metadata["preprocess"], args.model)
    result = evaluate_logits(forward, dataset, transform,
                             batch_size=args.batch_size, progress=not (args.quiet or args.json) and dist.main,
                             name=args.model, dist=dist)
    dist.close()
    if not dist.main:
        return 0
    out = result.to_dict()
    out["engine"] = args.engine
    out["quantized"] = "quantization" in graph.metadata
    out["processes"] = dist.world
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        kind = "int8 (fake-quant)" if out["quantized"] and args.engine == "npuforge" else (
            "int8" if out["quantized"] else "float")
        print(f"{args.model} [{kind}, {args.engine}]: top-1 {result.top1:.2f}%  top-5 {result.top5:.2f}%  "
              f"on {result.images} images ({result.images_per_s:.1f} images/s"
              f"{f' in {dist.world} processes' if dist.active else ''})"
              + (f", {result.skipped} unreadable skipped" if result.skipped else ""))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


class _Parser(argparse.ArgumentParser):
    """argparse with npuforge's one-line error format (exit 2)."""

    def error(self, message):
        command = self.prog.removeprefix("npuforge").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"npuforge: error: {where}{message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="npuforge",
        description="Take a trained network (ONNX or TFLite file, PyTorch module, zoo model) to an int8 NPU program.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("inspect", help="inputs, outputs, op histogram, parameters and MACs of a model",
                       description="Print what is in a model: inputs and outputs with shapes, the op histogram, "
                                   "the parameter count and the multiply-accumulates per sample.")
    p.add_argument("model", help="an ONNX file, a .tflite file or a saved npuforge IR")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("check", help="check a model's IR: references, order, cycles, attributes, shapes",
                       description="Import (or load) a model and run the IR checker; prints each problem with "
                                   "the node it concerns. Exit 0 when sound, 1 when problems were found.")
    p.add_argument("model", help="an ONNX file, a .tflite file or a saved npuforge IR")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("run", help="run a model (float, fake-quant or integer) or an NPU program on .npy inputs",
                       description="Run a model on .npy inputs and save its outputs. With --mode int a quantized "
                                   "IR runs in the integer simulator: a float input is quantized with the "
                                   "input value's parameters (an integer .npy of the input's quantized dtype is "
                                   "taken as codes) and the outputs are dequantized to float32 (--codes keeps "
                                   "them as integers). A compiled program (.npub, npuforge compile) runs in the "
                                   "program simulator, which reads only the binary (--mode does not apply; an "
                                   "image file is preprocessed as the program records).")
    p.add_argument("model", help="an ONNX file, a .tflite file, a saved npuforge IR or an NPU program (.npub)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input tensor (repeat for several inputs; NAME= may be left out for a one-input model; "
                        "for an .npub program also an image file)")
    p.add_argument("--output", metavar="OUT.npz", help="write the outputs to this .npz file")
    p.add_argument("--mode", choices=("int", "fake", "float"), default="float",
                   help="int: the integer simulator (a quantized IR); fake: fake-quant (float kernels, values "
                        "rounded to their grid); float: the float graph (default)")
    p.add_argument("--rounding", choices=("fixedpoint", "single", "onnx"), default="fixedpoint",
                   help="integer requantization: fixedpoint (gemmlowp/TFLite, the NPU's; default), single (the "
                        "same integers, one rounding) or onnx (float scales, round half to even, as ONNX QLinear ops)")
    p.add_argument("--sim-engine", choices=("auto", "ort", "plain", "fast"), default="auto", help=SIM_ENGINE_HELP)
    p.add_argument("--codes", action="store_true", help="with --mode int: write the outputs' integer codes")
    p.set_defaults(func=cmd_run, outputs=lambda a: [Planned(Path(a.output), "npz", "--output")] if a.output else [])

    p = sub.add_parser("ops", help="list the supported ops (the op registry)",
                       description="List every op npuforge covers: its quantization rule (compute, matmul, "
                                   "elementwise, pool, lut, passthrough, concat, shape; float: kept in float) "
                                   "and a one-line summary of its semantics.")
    p.add_argument("--json", action="store_true", help="print JSON with inputs, outputs and attributes per op")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("eval", help="top-1 / top-5 of a model (float, quantized IR or QDQ ONNX) on images",
                       description="Classify a folder of images (or of .npy / .npz / .wav inputs, one subfolder "
                                   "per class) and print top-1 and top-5. A float model runs in float, a quantized "
                                   "IR in fake-quant (--engine npuforge), in the integer simulator (--engine int) or "
                                   "as QDQ in ONNX Runtime (--engine ort); an ONNX file with --engine ort runs as it "
                                   "is. Under torchrun each process classifies a share of the images; the counts "
                                   "are summed.")
    p.add_argument("model", help="a zoo name, an ONNX file (float or QDQ), a .tflite file (float or int8) or a saved "
                                 "IR (float or quantized)")
    p.add_argument("--data", required=True, metavar="DIR", help="images (class subfolders or <wnid>_name files), or "
                                                                 "class subfolders of .npy / .npz / .wav model "
                                                                 "inputs")
    p.add_argument("--class-table", metavar="TSV", help="class table for flat folders (index, wnid, name)")
    p.add_argument("--engine", default="npuforge", choices=("npuforge", "ort", "int"),
                   help="who computes (default npuforge); int: the integer simulator (fixed-point rounding; float "
                        "images quantized with the input's parameters, logits dequantized to float)")
    p.add_argument("--sim-engine", choices=("auto", "ort", "plain", "fast"), default="fast",
                   help="with --engine int: " + SIM_ENGINE_HELP.replace("auto (default: ", "auto (") +
                   " (default here fast: top-1 as analyze scores it)")
    p.add_argument("--skip", type=int, default=0, metavar="N", help="leave out the first N images (file order)")
    p.add_argument("--limit", type=int, metavar="N", help="evaluate at most N images")
    p.add_argument("--batch-size", type=positive_int, default=25, help="batch size (default 25)")
    p.add_argument("--preprocess", metavar="ZOO_MODEL", help="this zoo model's preprocessing (for ONNX files)")
    add_preprocess_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (top1, top5, images, ...)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--task", choices=("classification", "detection"), default="classification",
                   help="detection: COCO mAP of a detector graph against --annotations (pycocotools); --engine "
                        "npuforge runs a float graph in float and a quantized one in fake-quant, int in integers")
    p.add_argument("--annotations", metavar="COCO.json", help="with --task detection: the COCO annotation file "
                                                               "(its images are looked up in --data)")
    p.add_argument("--category", metavar="NAME", help="with --task detection: the annotation category the "
                                                      "detector's class is (default: the file's only category)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("demo", help="the main job: quantize EfficientNet-Lite0 and compare FP32 with INT8",
                       description="EfficientNet-Lite0 with its pretrained ImageNet weights: import, optimize, "
                                   "calibrate and quantize to int8, then FP32 and INT8 predictions side by side on "
                                   "the photos scikit-image ships. Needs no arguments. With --data DIR: calibrate "
                                   "on the first --num-calib images and print top-1 on the rest.")
    p.add_argument("--data", metavar="DIR", help="a labelled image folder (class subfolders or <wnid>_name files)")
    p.add_argument("--num-calib", type=int, default=100, help="calibration images from --data (default 100)")
    p.add_argument("--limit", type=int, help="evaluate at most this many of the remaining images")
    p.set_defaults(func=cmd_demo)

    # Subcommands that live beside the code they drive.
    for module, hook in ((".passes.cli", "add_optimize_parser"), (".quant.cli", "add_quantize_parser"),
                         (".zoo.cli", "add_zoo_parser"), (".analysis.cli", "add_analyze_parser"),
                         (".export.cli", "add_export_parser"), (".qat.cli", "add_qat_parser"),
                         (".compiler.cli", "add_compile_parser"), (".detection.cli", "add_detect_parser")):
        full = f"{__package__}{module}"
        try:
            mod = importlib.import_module(full)
        except ModuleNotFoundError as e:
            if e.name == full:
                continue  # that part of npuforge is not installed
            raise
        getattr(mod, hook)(sub)
    for p in sub.choices.values():  # every command that reads a MODEL can fix its input sizes
        if any(a.dest == "model" for a in p._actions):
            add_input_shape_option(p)
    for p in command_parsers(parser):  # every command that writes files can be told to replace them
        if p.get_default("outputs") is not None:
            add_force_option(p)
    return parser


def command_parsers(parser):
    """Every (sub)command's parser, the zoo's included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                yield p
                yield from command_parsers(p)


def main(argv: list[str] | None = None) -> int:
    from .memory import keep_freed_memory

    keep_freed_memory()  # batches of images reuse freed blocks instead of faulting fresh pages in (memory.py)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed on one line
        return e.code if isinstance(e.code, int) else 2
    try:
        plan = getattr(args, "outputs", None)
        if plan is not None:  # before any work: nothing the user gave is overwritten
            check_outputs(plan(args), input_files(args), force=args.force)
        return args.func(args)
    except NpuforgeError as e:
        print(f"npuforge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("npuforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the output was piped into `head` or the like, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Exception as e:  # a bug: one line for the user, the traceback behind NPUFORGE_DEBUG=1
        if os.environ.get("NPUFORGE_DEBUG"):
            raise
        print(internal_error_line(args, e), file=sys.stderr)
        return INTERNAL_ERROR


INTERNAL_ERROR = 3  # exit code of an unexpected exception (2: the user's error, 1: check found problems)


def internal_error_line(args, error: BaseException) -> str:
    """``npuforge: internal error: COMMAND on INPUT: Type: reason ...``, one line."""
    command = " ".join(str(getattr(args, d)) for d in ("command", "zoo_command") if getattr(args, d, None))
    subject = next((str(getattr(args, d)) for d in ("model", "name") if getattr(args, d, None)), None)
    reason = " ".join(str(error).split())[:300]
    return (f"npuforge: internal error: {command}{' on ' + subject if subject else ''}: {type(error).__name__}"
            f"{': ' + reason if reason else ''} (a bug in npuforge; rerun with NPUFORGE_DEBUG=1 for the traceback "
            f"and report it)")


if __name__ == "__main__":
    sys.exit(main())
