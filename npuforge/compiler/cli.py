"""``npuforge compile``: a quantized IR -> an NPU program (.npub); and ``npuforge run X.npub``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import NpuforgeError

def parse_bytes(text: str) -> int:
    """'393216', '384K', '384KiB', '1.5M' -> bytes (K and KiB are 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(k|kib|kb|m|mib|mb)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise NpuforgeError(f"--sram {text}: not a size; write bytes or e.g. 384K, 1.5M")
    unit = (m.group(2) or "").lower()[:1]
    value = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[unit]
    if value < 1:
        raise NpuforgeError(f"--sram {text}: must be at least one byte")
    return int(value)


def add_compile_parser(sub) -> None:
    from .target import builtin_targets

    p = sub.add_parser(
        "compile", help="compile a quantized IR into an NPU program (.npub) with a cycle estimate",
        description="Lower a quantized IR to NPU operations, cascade layers stripe by stripe where the whole "
                    "tensors do not fit the SRAM budget (at the fewest estimated cycles; among programs within "
                    "--cycle-tolerance of those, the smallest peak), plan SRAM, pack the weights and write a "
                    "versioned binary that `npuforge run PROGRAM.npub` executes bit-exactly as the integer "
                    "simulator does. Prints peak SRAM, the liveness bound, cycles, DRAM traffic and weight "
                    "sizes (docs/compiler.md).")
    p.add_argument("model", help="a quantized IR (npuforge quantize ... -o OUT.nfir)")
    p.add_argument("--target", default="npu256",
                   help=f"a built-in target ({', '.join(builtin_targets())}; default npu256) or a TOML file "
                        f"describing one")
    p.add_argument("--sram", metavar="BYTES", help="SRAM budget (default: the target's SRAM), e.g. 393216 or 384K")
    p.add_argument("--output", "-o", required=True, metavar="OUT.npub", help="the program to write")
    p.add_argument("--cycle-tolerance", type=float, default=0.01, metavar="F",
                   help="trade up to this fraction of extra cycles for a smaller SRAM peak (default 0.01; 0: "
                        "the fewest cycles, cascading only what must be)")
    p.add_argument("--csv", metavar="LAYERS.csv", help="write the per-layer figures as CSV")
    p.add_argument("--report", metavar="REPORT.html", help="write an HTML report (memory along the schedule, "
                                                            "cycles per layer, compute vs transfer)")
    p.add_argument("--json", action="store_true", help="print one JSON object (totals and per-layer figures)")
    p.set_defaults(func=cmd_compile, outputs=_planned)


def _planned(args):
    from ..outputs import Planned

    return [Planned(Path(args.output), "npub", "--output")] + [
        Planned(Path(f), "text", option) for f, option in ((args.csv, "--csv"), (args.report, "--report")) if f]


def cmd_compile(args) -> int:
    from .. import load
    from ..fileio import write_atomic
    from .compile import compile_graph
    from .report import layer_rows, summary_lines, write_csv
    from .target import load_target

    if not 0 <= args.cycle_tolerance <= 10:
        raise NpuforgeError(f"--cycle-tolerance {args.cycle_tolerance}: must be between 0 and 10")
    target = load_target(args.target)
    budget = parse_bytes(args.sram) if args.sram else None
    graph = load(args.model)
    program = compile_graph(graph, target, budget, tolerance=args.cycle_tolerance)
    write_atomic(Path(args.output), program.data)
    rows = layer_rows(program)
    if args.csv:
        write_csv(Path(args.csv), rows)
    if args.report:
        from .report import write_html

        write_html(Path(args.report), program, rows)
    if args.json:
        print(json.dumps({**program.stats, "output": args.output, "bytes": len(program.data), "layers": rows},
                         indent=2))
    else:
        for line in summary_lines(program):
            print(line)
        written = [args.output] + [f for f in (args.csv, args.report) if f]
        print(f"  wrote {', '.join(written)} ({len(program.data):,} bytes program)")
    return 0


def _image(image, file: str):
    """An image file fed to a program: preprocessed as the program records (None: not an image)."""
    from PIL import Image, UnidentifiedImageError

    from ..workflow import transform_of
    from ..zoo.data import IMAGE_EXTENSIONS

    if Path(file).suffix.lower() not in IMAGE_EXTENSIONS:
        return None
    pre = image.meta.get("preprocess")  # its fields were checked when the program was read
    if not pre:
        raise NpuforgeError(f"--input {file}: the program records no preprocessing; give a .npy input")
    sizes = [list(shape[2:]) for _, shape in image.inputs if len(shape) == 4]
    if pre["crop_size"] not in sizes:  # before the image is resized to it
        raise NpuforgeError(f"--input {file}: the program's preprocessing makes {pre['crop_size'][0]}x"
                            f"{pre['crop_size'][1]} images; its image inputs are "
                            f"{', '.join(f'{h}x{w}' for h, w in sizes) or 'none'}")
    try:
        with Image.open(file) as img:
            x = transform_of(pre)(img)
    except (OSError, UnidentifiedImageError) as e:
        raise NpuforgeError(f"--input {file}: cannot read the image ({e})") from None
    return x[None]


def run_program(args) -> dict:
    """``npuforge run PROGRAM.npub``: the outputs of the program simulator, which reads nothing but
    the binary (dequantized with each output's grid unless --codes)."""
    import numpy as np

    from ..cli import parse_inputs
    from .progsim import ProgramSimulator, load_program

    image = load_program(args.model)
    names = [image.tensors[t].name for t, _ in image.inputs]
    feeds = parse_inputs(names, args.input, "program", read=lambda file: _image(image, file))
    results = ProgramSimulator(image).run(feeds)
    if args.codes:
        return results
    grids = {image.tensors[t].name: image.tensors[t] for t, _ in image.outputs}
    # (an output the program computes in float has scale 1 and zero point 0: it passes unchanged)
    return {k: ((v.astype(np.float64) - grids[k].zero_point) * np.float64(np.float32(grids[k].scale))
                ).astype(np.float32) for k, v in results.items()}
