"""The integer simulator against ONNX Runtime on a quantized model, in one run.

    .venv/bin/python benchmarks/sim_vs_ort.py QMODEL.nfir [--batch 25] [--batches 2] [--threads 2] [--rounds 3]
    .venv/bin/python benchmarks/sim_vs_ort.py QMODEL.nfir --agreement DIR [--skip 100] [--rounding MODES]

Throughput (default): images/s of the integer simulator (fixedpoint and onnx
rounding; its plain torch path and its ONNX Runtime lowerings: ONNX Runtime's
integer operators, and float operators on exact integers) and of an ONNX
Runtime session of npuforge's QDQ export (ORT fuses it into its int8 kernels),
and of the float model (the ceiling of anything on float kernels), same random
batch, same thread count, one process, after one warm-up batch each. The engines
are timed in interleaved rounds (--rounds, each --batches batches) and each keeps
its best round, so a drift of the machine's speed over the run (up to 1.5x between
two timings of one session on these machines) does not favour whichever engine
ran in the fast stretch. Each timing starts after a pause and one untimed batch, so no
engine pays for the threads of the one before it, still spinning; prints the table and the ratios to ONNX Runtime's QDQ
session.

--agreement DIR [--rounding fixedpoint,single,onnx]: top-1 of the integer
simulator in each rounding mode and of fake-quant on the images of DIR (after
--skip), and each mode's top-1 agreement with fake-quant.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import npuforge  # noqa: E402
from npuforge.argtypes import non_negative_int, positive_int  # noqa: E402
from npuforge.errors import NpuforgeError, UnsupportedError  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402
from npuforge.sim.lowered import LoweredSimulator, make_simulator  # noqa: E402


PAUSE_S = 0.2


def throughput(fn, x, batches: int) -> float:
    # The engine timed before this one leaves its thread pool spinning for a while (ONNX Runtime's
    # and torch's threads busy-wait after a run): on 2 cores that slowed the next engine's first
    # batches by up to 1.5x. One untimed batch after a pause starts every engine alike.
    time.sleep(PAUSE_S)
    fn(x)
    start = time.perf_counter()
    for _ in range(batches):
        fn(x)
    return batches * len(x) / (time.perf_counter() - start)


def bench(graph, batch: int, batches: int, threads: int, rounds: int) -> None:
    import onnxruntime as ort

    from npuforge.export import to_onnx, to_qdq_onnx

    torch.set_num_threads(threads)
    x = np.random.default_rng(0).standard_normal((batch, *graph.values[graph.inputs[0]].shape[1:])).astype(np.float32)
    name = graph.inputs[0]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    engines = []  # (label, run a batch), all built first, then timed in interleaved rounds
    session = ort.InferenceSession(to_qdq_onnx(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    auto = make_simulator(graph, "fixedpoint")
    built = time.perf_counter() - start
    how = f"split: plain from {auto.plain_from}" if hasattr(auto, "plain_from") else type(auto).__name__
    engines.append((f"integer simulator, `fixedpoint`, `make_simulator` (auto: {how}; built in {built:.1f} s)",
                    lambda a: auto.run({name: a})))
    for mode, form in (("fixedpoint", "qoperator"), ("fixedpoint", "float"), ("onnx", "qoperator")):
        start = time.perf_counter()
        try:
            low = LoweredSimulator(graph, mode, threads, form=form)
        except UnsupportedError as e:  # the whole graph in one lowering: not where a node has none
            engines.append((f"integer simulator, `{mode}`, ONNX Runtime lowering, {form} form (refused: {e})", None))
            continue
        built = time.perf_counter() - start
        split = sum(1 for how in low.lowering.values() if how.startswith("QLinearConv; ") or "reproduces: all" in how)
        engines.append((f"integer simulator, `{mode}`, ONNX Runtime lowering, {form} form (built in {built:.1f} s"
                        f"{f'; {split} convolutions with channels apart' if split else ''})",
                        lambda a, low=low: low.run({name: a})))
    for mode in ("fixedpoint", "onnx"):
        sim = IntegerSimulator(graph, mode)
        engines.append((f"integer simulator, `{mode}`, plain torch path", lambda a, sim=sim: sim.run({name: a})))
    engines.append(("ONNX Runtime, QDQ export (int8 kernels)", lambda a: session.run(None, {name: a})))
    # the ceiling of any integer program run on float kernels: the float model itself
    float_session = ort.InferenceSession(to_onnx(graph).SerializeToString(), options,
                                         providers=["CPUExecutionProvider"])
    engines.append(("ONNX Runtime, the float model (fp32 kernels)", lambda a: float_session.run(None, {name: a})))
    for _, run in engines:
        if run is not None:
            run(x)  # warm-up (prepares the simulator's constants, ORT's kernels)
    best = [0.0] * len(engines)
    for _ in range(rounds):  # the machine's speed drifts: every engine is timed in every round, its best kept
        for k, (_, run) in enumerate(engines):
            if run is not None:
                best[k] = max(best[k], throughput(run, x, batches))
    print(f"{graph.name}: batch {batch}, {batches} timed batches x {rounds} interleaved rounds (each engine's best "
          f"round), {threads} threads, torch {torch.__version__}, onnxruntime {ort.__version__}")
    reference = best[-2]
    print("| engine | images/s | vs ONNX Runtime's QDQ |\n|---|---:|---:|")
    for (label, run), ips in zip(engines, best):
        print(f"| {label} | {ips:.1f} | {ips / reference:.2f}x |" if run is not None else f"| {label} | - | - |")


def agreement(graph, data: str, skip: int, limit: int | None, batch: int, threads: int, modes: list) -> None:
    from npuforge.sim.fake_quant import run_fake_quant
    from npuforge.workflow import transform_of
    from npuforge.zoo.data import ImageDataset, iter_batches

    torch.set_num_threads(threads)
    dataset = ImageDataset(data, None, limit=limit, skip=skip)
    name, out = graph.inputs[0], graph.outputs[0]
    engines = {mode: (lambda a, s=make_simulator(graph, mode): s.run({name: a})[out]) for mode in modes}
    engines["fake-quant"] = lambda a: run_fake_quant(graph, {name: a})[out]
    correct = {k: 0 for k in engines}
    agree = {k: 0 for k in modes}
    seen = 0
    start = time.perf_counter()
    for x, y, _ in iter_batches(dataset, transform_of(graph.metadata["preprocess"]), batch, 2):
        top = {k: np.asarray(f(x)).argmax(axis=1) for k, f in engines.items()}
        for k in engines:
            correct[k] += int((top[k] == y).sum())
        for k in modes:
            agree[k] += int((top[k] == top["fake-quant"]).sum())
        seen += len(y)
        print(f"\r{seen} images", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"{graph.name} on {seen} images of {data} (skip {skip}), {time.perf_counter() - start:.0f} s")
    fq = correct["fake-quant"]
    print(f"fake-quant top-1 {100 * fq / seen:.2f}%")
    for k in modes:
        print(f"integer ({k}) top-1 {100 * correct[k] / seen:.2f}% ({100 * (correct[k] - fq) / seen:+.2f} points "
              f"vs fake-quant), top-1 agreement with fake-quant {100 * agree[k] / seen:.2f}% ({agree[k]}/{seen})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a quantized IR (npuforge quantize ... -o MODEL.nfir)")
    p.add_argument("--batch", type=positive_int, default=25)
    p.add_argument("--batches", type=positive_int, default=2, help="timed batches per engine")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="interleaved timing rounds; each engine's best is kept")
    p.add_argument("--agreement", metavar="DIR", help="instead: top-1 and agreement of int vs fake-quant on DIR")
    p.add_argument("--rounding", default="fixedpoint", help="comma-separated rounding modes for --agreement")
    p.add_argument("--skip", type=non_negative_int, default=100)
    p.add_argument("--limit", type=positive_int)
    args = p.parse_args()
    try:
        graph = npuforge.load(args.model)
        if args.agreement:
            agreement(graph, args.agreement, args.skip, args.limit, args.batch, args.threads, args.rounding.split(","))
        else:
            bench(graph, args.batch, args.batches, args.threads, args.rounds)
    except NpuforgeError as e:  # a missing or unreadable model, a bad --agreement folder: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
