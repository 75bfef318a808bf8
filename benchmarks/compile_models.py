"""The NPU compiler on real models: SRAM, cycles and bit-exactness at three budgets.

    .venv/bin/python benchmarks/compile_models.py [--models efficientnet_lite0,mobilenet_v2] [--photos 100]

For each model: quantize it (per-channel, uint8 activations, --num-calib photos), compile it
for the npu256 target with whole tensors (no budget, no cycle traded), at 384 KiB, and at
the smallest budget it compiles under (found by bisection to 1 KiB); print per program the
peak SRAM, the liveness bound, cycles against the untiled program, DRAM traffic, weight
bytes and compile time; then run the first ``--photos`` photos after the calibration ones
through every program in the program simulator and through the graph-level integer
simulator and count the photos whose output codes are identical (all of them, or the
script exits 1).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import npuforge  # noqa: E402
from npuforge.cli import main as cli_main  # noqa: E402
from npuforge.compiler.binfmt import read_program  # noqa: E402
from npuforge.compiler.compile import compile_graph  # noqa: E402
from npuforge.compiler.progsim import ProgramSimulator  # noqa: E402
from npuforge.compiler.target import load_target  # noqa: E402
from npuforge.errors import NpuforgeError  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402
from npuforge.workflow import transform_of  # noqa: E402
from npuforge.zoo.data import ImageDataset, iter_batches  # noqa: E402

KIB = 1024


def smallest_budget(graph, target, hi: int) -> int:
    lo = 0  # fails (nothing fits in 0 bytes); hi compiles
    while hi - lo > KIB:
        mid = (lo + hi) // 2
        try:
            compile_graph(graph, target, mid)
            hi = mid
        except NpuforgeError:
            lo = mid
    return hi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="efficientnet_lite0,mobilenet_v2")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/imagenet-sample-even"))
    ap.add_argument("--num-calib", type=int, default=50)
    ap.add_argument("--photos", type=int, default=100)
    ap.add_argument("--target", default="npu256")
    args = ap.parse_args()
    target = load_target(args.target)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            path = Path(tmp) / f"{model}.nfir"
            assert cli_main(["quantize", model, "--calib", args.data, "--num-calib", str(args.num_calib),
                             "-o", str(path)]) == 0
            graph = npuforge.load(path)
            t0 = time.perf_counter()
            least = smallest_budget(graph, target, 384 * KIB)
            search = time.perf_counter() - t0
            programs = {"whole tensors": compile_graph(graph, target, 1 << 30, tolerance=0.0),
                        "384 KiB": compile_graph(graph, target, 384 * KIB),
                        f"smallest ({least / KIB:.0f} KiB)": compile_graph(graph, target, least)}
            print(f"\n{model} on {target.name} (smallest budget found by bisection in {search:.0f} s)")
            print(f"{'program':<22}{'peak KiB':>10}{'bound KiB':>11}{'cycles':>12}{'vs untiled':>11}{'DRAM KiB':>10}"
                  f"{'commands':>10}{'cascades':>10}{'compile s':>10}")
            for name, p in programs.items():
                s = p.stats
                print(f"{name:<22}{s['peak_sram'] / KIB:>10.1f}{s['liveness_bound'] / KIB:>11.1f}{s['cycles']:>12,}"
                      f"{100 * (s['cycles'] / s['untiled_cycles'] - 1):>+10.1f}%{s['dram_bytes'] / KIB:>10.1f}"
                      f"{s['commands']:>10}{len(s['cascades']):>10}{s['compile_seconds']:>10.1f}")
            s = programs["whole tensors"].stats
            print(f"no reuse {s['no_reuse_bytes'] / KIB:,.1f} KiB; whole-tensor liveness bound "
                  f"{s['untiled_liveness_bound'] / KIB:,.1f} KiB; weights {s['weight_bytes_raw']:,} B raw, "
                  f"{s['weight_bytes_stored']:,} B stored ({s['weight_bytes_raw'] / s['weight_bytes_stored']:.3f}x)")
            dataset = ImageDataset(args.data, None, limit=args.photos, skip=args.num_calib)
            sims = {name: ProgramSimulator(read_program(p.data)) for name, p in programs.items()}
            same = dict.fromkeys(sims, 0)
            ref = IntegerSimulator(graph)
            seconds = 0.0
            name_in, name_out = graph.inputs[0], graph.outputs[0]
            for x, _, _ in iter_batches(dataset, transform_of(graph.metadata["preprocess"]), 25, 2):
                want = ref.run({name_in: x}, dequantize=False)[name_out]
                for name, sim in sims.items():
                    for k in range(len(x)):
                        t = time.perf_counter()
                        got = sim.run({name_in: x[k:k + 1]})[name_out]
                        seconds += time.perf_counter() - t
                        same[name] += int(np.array_equal(got, want[k:k + 1]))
            n = len(dataset)
            for name, count in same.items():
                print(f"program simulator = integer simulator, {name}: {count}/{n} photos")
                failures += count != n
            print(f"program simulator: {seconds / (n * len(sims)):.2f} s per photo")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
