"""QAT against PTQ on the shared sample: train on part of it, evaluate on the rest.

The 500 shared photos are split by a seeded permutation into a training part (QAT's
data and the PTQ calibration images) and a test part. On the test part, in one run:
the float model's top-1; per-tensor (or per-channel) PTQ with the default recipe and
with --equalize --bias-correction (and --adaround with ``--adaround``), each run by the
integer simulator; ``npuforge qat`` (distillation of the float model, no labels used)
run by the integer simulator from the written IR; the QAT model's own evaluation forward
against that simulator (top-1 agreement, largest logit difference in output steps); and
the QDQ export of the QAT IR in ONNX Runtime (graph optimizations off) against the
fake-quant executor's top-1. Every program's mean KL divergence from the float model on the
test photos, and the share that keep the float model's top-1, are printed beside its top-1
(continuous, where a top-1 on 200 photos moves by whole photos). ``--val N`` holds N of the
training photos out of PTQ and QAT alike, for QAT to rank its epochs and its PTQ start on.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/qat.py [--models efficientnet_lite0] \
        [--granularity per-tensor] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def split(root: Path, shared: Path, n_train: int, seed: int, n_val: int = 0,
          fold: tuple[int, int] | None = None) -> tuple[Path, Path, Path]:
    """(train, validation, test) folders of links: the first ``n_train`` photos of a seeded
    permutation train, their last ``n_val`` of them validate, the rest test. With ``fold``
    (k, n), the permutation's k-th of n equal parts tests and the others train, so the n
    folds test every photo once."""
    files = sorted((shared / "imagenet-sample-even").iterdir())
    order = np.random.default_rng(seed).permutation(len(files))
    if fold is not None:
        k, n = fold
        lo, hi = k * len(files) // n, (k + 1) * len(files) // n
        order, n_train = np.concatenate([order[:lo], order[hi:], order[lo:hi]]), len(files) - (hi - lo)
    parts = (("train", order[:n_train - n_val]), ("val", order[n_train - n_val:n_train]), ("test", order[n_train:]))
    for part, idx in parts:
        (root / part).mkdir(parents=True)
        for k in sorted(idx):
            (root / part / files[k].name).symlink_to(files[k])
    return root / "train", root / "val", root / "test"


def top1(forward, folder: Path, preprocess: dict) -> tuple[float, np.ndarray]:
    """(top-1 %, logits of every test image in file order)."""
    from npuforge.workflow import transform_of
    from npuforge.zoo.data import ImageDataset, iter_batches

    ds = ImageDataset(folder)
    logits, labels = [], []
    for x, y, _ in iter_batches(ds, transform_of(preprocess), 25, 2):
        logits.append(np.asarray(forward(x)))
        labels.append(y)
    logits, labels = np.concatenate(logits), np.concatenate(labels)
    return 100.0 * float((logits.argmax(1) == labels).mean()), logits


def fidelity(reference: np.ndarray, logits: np.ndarray) -> tuple[float, float]:
    """(mean KL divergence of the program's softmax from the float model's, in nats; top-1
    agreement with the float model, %): what QAT's distillation fits, measured on the test
    photos. Continuous, so far less noisy than a top-1 on 200 photos."""
    p = torch.softmax(torch.from_numpy(reference).double(), 1)
    log_q = torch.log_softmax(torch.from_numpy(logits).double(), 1)
    kl = float((p * (torch.log(p.clamp_min(1e-300)) - log_q)).sum(1).mean())
    return kl, 100.0 * float((reference.argmax(1) == logits.argmax(1)).mean())


def calibration(folder: Path, preprocess: dict, n: int) -> list:
    from npuforge.workflow import transform_of
    from npuforge.zoo.data import ImageDataset, iter_batches

    ds = ImageDataset(folder)
    ds.samples = ds.samples[:n]
    return [x for x, _, _ in iter_batches(ds, transform_of(preprocess), 25, 2)]


PROGRAMS = ("float", "ptq_default", "ptq_equalize_bias_correction", "ptq_equalize_bias_correction_adaround", "qat")


def pool(paths: list[Path]) -> int:
    """The --json records of several runs (the folds of one --folds N) pooled per model and
    granularity: correct photos summed, KL and float top-1 kept averaged over the photos."""
    rows = [r for path in paths for r in json.loads(path.read_text())]
    ptq = [k for k in PROGRAMS[1:-1] if all(f"{k}_top1" in r for r in rows)]  # the recipes every run has
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["model"], r["granularity"]), []).append(r)
    print("| model | weights | runs | photos | " + " | ".join(k.replace("_", " ") for k in ["float", *ptq, "qat"])
          + " | QAT KL / float top-1 kept | best PTQ KL / float top-1 kept | QAT wrote its start |")
    print("|---|---|---:|---:|" + "---:|" * (len(ptq) + 2) + "---:|---:|---:|")
    for (model, granularity), runs in groups.items():
        n = sum(r["test_images"] for r in runs)

        def correct(key):
            c = sum(round(r[f"{key}_top1"] * r["test_images"] / 100) for r in runs)
            return f"{c} ({100 * c / n:.1f} %)"

        def mean(key):
            return sum(r[key] * r["test_images"] for r in runs) / n

        best = min(ptq, key=lambda k: mean(f"{k}_kl"))
        print(f"| {model} | {granularity} | {len(runs)} | {n} | "
              + " | ".join(correct(k) for k in ["float", *ptq, "qat"])
              + f" | {mean('qat_kl'):.4f} / {mean('qat_agreement'):.1f} % | {mean(f'{best}_kl'):.4f} / "
              f"{mean(f'{best}_agreement'):.1f} % ({best.replace('_', ' ')}) | "
              f"{sum(r['qat_best_epoch'] == 0 for r in runs)} of {len(runs)} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--models", default="efficientnet_lite0")
    ap.add_argument("--granularity", default="per-tensor", choices=("per-tensor", "per-channel"))
    ap.add_argument("--train", type=int, default=300, help="training photos (the rest are the test part)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--start", choices=("ptq", "equalize-bias-correction", "adaround", "best"),
                    default="equalize-bias-correction",
                    help="QAT's starting point (default: the equalized, bias-corrected weights; adaround: those "
                         "with AdaRound's rounding, qat --equalize --bias-correction --adaround, which also adds "
                         "that PTQ row; best: qat --best-start, the better of the two on the --val photos)")
    ap.add_argument("--adaround", action="store_true", help="also PTQ with AdaRound (minutes)")
    ap.add_argument("--adaround-cache", type=Path, metavar="DIR",
                    help="keep AdaRound's learnt rounding here, per model (default: the run's temporary folder); "
                         "a rerun on the same fold reuses it")
    ap.add_argument("--learn-scales", action="store_true", help="QAT learns the activation scales too (LSQ)")
    ap.add_argument("--val", type=int, default=0,
                    help="training photos held out (from PTQ and QAT alike) for QAT to rank its epochs and its "
                         "PTQ start on, by the KL divergence from the float model (default 0: none, QAT writes "
                         "its last epoch)")
    ap.add_argument("--folds", type=int, default=0,
                    help="cross-validation: the seeded permutation in N equal parts, one testing and the others "
                         "training (--train is then ignored); give the part with --fold")
    ap.add_argument("--fold", type=int, default=0, help="which of --folds parts tests (0 to N-1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="JSON",
                    help="instead of running: pool the --json records of earlier runs (the folds of one --folds "
                         "N) per model, and print their table")
    args = ap.parse_args()
    if args.pool:
        return pool(args.pool)
    if args.folds and not 0 <= args.fold < args.folds:
        ap.error(f"--fold {args.fold}: give 0 to {args.folds - 1}")
    if args.start == "best" and not args.val:
        ap.error("--start best picks QAT's start on the --val photos: give --val N")

    import npuforge
    from npuforge.export import to_qdq_onnx
    from npuforge.qat.trainer import QATConfig, QATTrainer, prepare_graph
    from npuforge.train.loop import train_with
    from npuforge.sim.fake_quant import run_fake_quant
    from npuforge.sim.integer import IntegerSimulator

    work = Path(tempfile.mkdtemp(prefix="npuforge-qat-"))
    train_dir, val_dir, test_dir = split(work / "data", args.shared, args.train, args.seed, args.val,
                                        (args.fold, args.folds) if args.folds else None)
    rows = []
    for name in args.models.split(","):
        graph = prepare_graph(name)
        pp = graph.metadata["preprocess"]
        row = {"model": name, "granularity": args.granularity, "test_images": sum(1 for _ in test_dir.iterdir()),
               "fold": f"{args.fold}/{args.folds}" if args.folds else None}
        row["float_top1"], float_logits = top1(lambda x: graph.run({graph.inputs[0]: x})[graph.outputs[0]],
                                               test_dir, pp)
        calib = calibration(train_dir, pp, 100)
        recipes = {"ptq_default": {}, "ptq_equalize_bias_correction": {"equalize": True, "bias_correction": True}}
        adaround_cache = str((args.adaround_cache or work) / f"{name}-adaround")  # for the PTQ row and QAT's start
        if args.adaround or args.start == "adaround":
            recipes["ptq_equalize_bias_correction_adaround"] = {"equalize": True, "bias_correction": True,
                                                                "adaround": True, "adaround_cache": adaround_cache}
        for recipe, extra in recipes.items():
            t = time.perf_counter()
            q = npuforge.quantize(graph, calib, {"granularity": args.granularity, **extra}, optimize=False,
                                  log=lambda m: None)
            row[f"{recipe}_s"] = round(time.perf_counter() - t, 1)
            sim = IntegerSimulator(q)
            row[f"{recipe}_top1"], logits = top1(lambda x: sim.run({q.inputs[0]: x})[q.outputs[0]], test_dir, pp)
            row[f"{recipe}_kl"], row[f"{recipe}_agreement"] = fidelity(float_logits, logits)
            print(f"{name}: {recipe} {row[f'{recipe}_top1']:.1f} % (KL to float {row[f'{recipe}_kl']:.4f}, "
                  f"float top-1 kept on {row[f'{recipe}_agreement']:.1f} %)", flush=True)
        out = work / f"{name}-qat.nfir"
        start = {"ptq": {}, "best": {}, "equalize-bias-correction": {"equalize": True, "bias_correction": True},
                 "adaround": {"equalize": True, "bias_correction": True, "adaround": True,
                              "adaround_cache": adaround_cache}}[args.start]
        cfg = QATConfig(model=name, data=str(train_dir), output=str(work / f"{name}-run"), result=str(out),
                        quant={"granularity": args.granularity, **start}, epochs=args.epochs,
                        batch_size=args.batch_size, lr=args.lr, val=str(val_dir) if args.val else None, val_split=0.0,
                        num_calib=100, seed=args.seed, workers=2, label_smoothing=0.0, crop_scale=0.5,
                        learn_scales=args.learn_scales, best_start=args.start == "best")
        t = time.perf_counter()
        trainer = QATTrainer(cfg, graph, log=lambda m: print(f"  {m}", flush=True), progress=False)
        train_with(trainer)
        row["qat_s"] = round(time.perf_counter() - t, 1)
        row["qat_best_epoch"] = trainer.state["ranking"][0][1]
        row["qat_start"] = trainer.program.start
        q = npuforge.load(out)
        sim = IntegerSimulator(q)
        row["qat_top1"], sim_logits = top1(lambda x: sim.run({q.inputs[0]: x})[q.outputs[0]], test_dir, pp)
        row["qat_kl"], row["qat_agreement"] = fidelity(float_logits, sim_logits)
        print(f"{name}: qat {row['qat_top1']:.1f} % (KL to float {row['qat_kl']:.4f}, "
              f"float top-1 kept on {row['qat_agreement']:.1f} %)", flush=True)
        program = trainer.program  # the QAT model, holding the weights it wrote
        with torch.no_grad():
            _, own = top1(lambda x: program(torch.from_numpy(x)).numpy(), test_dir, pp)
        step = float(q.values[q.outputs[0]].quant.scale)
        row["sim_vs_qat_forward_agreement"] = 100.0 * float((own.argmax(1) == sim_logits.argmax(1)).mean())
        row["sim_vs_qat_forward_max_steps"] = float(np.abs(own - sim_logits).max() / step)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(to_qdq_onnx(q).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        row["qdq_ort_top1"], _ = top1(lambda x: session.run(None, {session.get_inputs()[0].name: x})[0], test_dir, pp)
        row["fake_quant_top1"], _ = top1(lambda x: run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]], test_dir, pp)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print()
    print("| model | weights | float | PTQ default | PTQ equalize + bias corr. | QAT | QAT time | sim vs QAT forward |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['granularity']} | {r['float_top1']:.1f} % | {r['ptq_default_top1']:.1f} % | "
              f"{r['ptq_equalize_bias_correction_top1']:.1f} % | {r['qat_top1']:.1f} % | {r['qat_s']:.0f} s "
              f"({args.epochs} epochs) | {r['sim_vs_qat_forward_agreement']:.1f} % |")
    print()
    print("KL divergence from the float model's softmax on the test photos (nats, mean) / float top-1 kept:")
    print("| model | weights | PTQ default | PTQ equalize + bias corr. | QAT |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        cells = [f"{r[k + '_kl']:.4f} / {r[k + '_agreement']:.1f} %"
                 for k in ("ptq_default", "ptq_equalize_bias_correction", "qat")]
        print(f"| {r['model']} | {r['granularity']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
