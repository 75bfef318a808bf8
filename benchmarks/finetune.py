"""Fine-tuning on the 10 superclasses of the shared sample, against a linear probe.

The 500 photos are sorted into ../shared/data/superclasses.tsv's 10 superclasses (dog,
bird, fish, food, artifact, ...) as a class-subfolder tree of links; a seeded split per
class keeps --test-fraction of each class for testing. Each model starts from its
pretrained ImageNet weights and is fine-tuned with ``npuforge zoo train`` (its own
validation split inside the training part); the linear probe is a logistic-regression
head (L-BFGS, L2 chosen on a seeded fifth of the training part) on the frozen pretrained
features of the same training images, which fine-tuning also starts from (``--probe-init``,
linear probing then fine-tuning); the majority class is the rate of the largest training
class on the test split. Everything in one run.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/finetune.py [--epochs 6]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from npuforge.train import TrainConfig, train
from npuforge.train.checkpoint import load_run, model_from
from npuforge.train.data import SampleSet, rng_for
from npuforge.train.probe import features, probe
from npuforge.workflow import preprocess_of, transform_of
from npuforge.zoo import create_model, get_config
from npuforge.zoo.registry import classifier_of

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def superclass_tree(root: Path, shared: Path, test_fraction: float, seed: int) -> tuple[Path, Path]:
    """train/ and test/ trees of links, one subfolder per superclass."""
    table = {r["wnid"]: r["superclass"] for r in csv.DictReader(open(shared / "superclasses.tsv"), delimiter="\t")}
    by_class: dict[str, list[Path]] = {}
    for p in sorted((shared / "imagenet-sample-even").iterdir()):
        by_class.setdefault(table[p.name.split("_", 1)[0]], []).append(p)
    for k, (name, files) in enumerate(sorted(by_class.items())):
        order = rng_for(seed, 9, k).permutation(len(files))
        n_test = int(round(len(files) * test_fraction)) if len(files) > 1 else 0
        for j, idx in enumerate(order):
            split = "test" if j < n_test else "train"
            (root / split / name).mkdir(parents=True, exist_ok=True)
            (root / split / name / files[idx].name).symlink_to(files[idx])
    return root / "train", root / "test"


def samples_of(folder: Path, classes: list) -> list:
    return [(str(p), classes.index(p.parent.name)) for p in sorted(folder.rglob("*")) if p.is_file()]


def linear_probe(name: str, train: list, test: list, classes: list, seed: int) -> dict:
    """The probe fitted on the frozen pretrained features of the training photos, scored on the test ones."""
    model = create_model(name, pretrained=True).eval()
    head, tf = classifier_of(model), transform_of(preprocess_of(get_config(name)))
    x, y = features(model, SampleSet(train, tf, seed, train=False), head)
    probed, mean, std, l2 = probe(x, y, len(classes), seed)
    xt, yt = features(model, SampleSet(test, tf, seed, train=False), head)
    return {"probe_top1": 100.0 * float((probed((xt - mean) / std).argmax(1) == yt).float().mean()), "probe_l2": l2}


def test_top1(run: Path, train: list, test: list, seed: int, refit: bool) -> dict:
    """The fine-tuned model's test top-1; with ``refit``, also that of the probe fitted anew on
    the fine-tuned features of the training photos (do they separate the classes better?)."""
    model, classes, pp = model_from(load_run(run / "best.pt"))
    head, tf = classifier_of(model), transform_of(pp)
    x, y = features(model, SampleSet(test, tf, seed, train=False), head)
    with torch.no_grad():
        scores = {"finetune_top1": 100.0 * float((head(x).argmax(1) == y).float().mean())}
    if refit:
        xs, ys = features(model, SampleSet(train, tf, seed, train=False), head)
        probed, mean, std, l2 = probe(xs, ys, len(classes), seed)
        scores["refit_top1"] = 100.0 * float((probed((x - mean) / std).argmax(1) == y).float().mean())
        scores["refit_l2"] = l2
    return scores


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--models", default="efficientnet_lite0,mobilenet_v2")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    ap.add_argument("--weight-decay", type=float, default=5e-5)
    ap.add_argument("--warmup-epochs", type=float, default=1.0)
    ap.add_argument("--crop-scale", type=float, default=0.08)
    ap.add_argument("--probe-init", action=argparse.BooleanOptionalAction, default=True,
                    help="start fine-tuning from the linear probe (default: yes)")
    ap.add_argument("--freeze-bn", action=argparse.BooleanOptionalAction, default=True,
                    help="BatchNorm keeps its pretrained statistics while fine-tuning (default: yes)")
    ap.add_argument("--trainable-layers", type=int, default=0,
                    help="train only the last K convolution / linear layers (default 0: all)")
    ap.add_argument("--val-split", type=float, default=0.0,
                    help="part of the training photos zoo train holds out to pick the best epoch (default 0: "
                         "none, it trains on the probe's photos and keeps the last epoch)")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--clip-grad", type=float, default=0.0, help="clip the gradient norm (default: no)")
    ap.add_argument("--refit", action="store_true",
                    help="also fit the probe anew on the fine-tuned features and score it")
    ap.add_argument("--test-fraction", type=float, default=0.4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npuforge-finetune-"))
    train_dir, test_dir = superclass_tree(work / "data", args.shared, args.test_fraction, args.seed)
    classes = sorted(p.name for p in train_dir.iterdir())
    counts = Counter(p.parent.name for p in test_dir.rglob("*") if p.is_file())
    train_counts = Counter(p.parent.name for p in train_dir.rglob("*") if p.is_file())
    majority = 100.0 * counts[train_counts.most_common(1)[0][0]] / sum(counts.values())
    print(f"{sum(train_counts.values())} training and {sum(counts.values())} test photos in {len(classes)} "
          f"superclasses; majority class ({train_counts.most_common(1)[0][0]}) {majority:.1f} % of the test photos",
          flush=True)
    train_set, test_set = samples_of(train_dir, classes), samples_of(test_dir, classes)
    rows = []
    for name in args.models.split(","):
        t = time.perf_counter()
        baseline = linear_probe(name, train_set, test_set, classes, args.seed)
        probe_s = time.perf_counter() - t
        t = time.perf_counter()
        cfg = TrainConfig(model=name, data=str(train_dir), output=str(work / name), epochs=args.epochs,
                          batch_size=args.batch_size, lr=args.lr, optimizer=args.optimizer,
                          weight_decay=args.weight_decay, warmup_epochs=args.warmup_epochs, seed=args.seed,
                          workers=2, val_split=args.val_split, probe_init=args.probe_init, crop_scale=args.crop_scale,
                          freeze_bn=args.freeze_bn, label_smoothing=args.label_smoothing,
                          clip_grad=args.clip_grad, trainable_layers=args.trainable_layers)
        result = train(cfg, log=lambda m: print(f"  {m}", flush=True), progress=False)
        rows.append({"model": name, **test_top1(work / name, train_set, test_set, args.seed, args.refit), **baseline,
                     "best_val": result["best_top1"], "train_s": time.perf_counter() - t, "probe_s": probe_s})
        print(rows[-1], flush=True)
    print()
    refit = ("probe refitted on the fine-tuned features | " if args.refit else "")
    print(f"| model | fine-tuned top-1 (test) | {refit}linear probe top-1 (test) | majority class | fine-tuning time "
          "| probe time |")
    print("|---|---:|" + ("---:|" if args.refit else "") + "---:|---:|---:|---:|")
    for r in rows:
        cell = f"{r['refit_top1']:.1f} % (L2 {r['refit_l2']:g}) | " if args.refit else ""
        print(f"| {r['model']} | {r['finetune_top1']:.1f} % | {cell}{r['probe_top1']:.1f} % (L2 {r['probe_l2']:g}) | "
              f"{majority:.1f} % | {r['train_s']:.0f} s ({args.epochs} epochs) | {r['probe_s']:.0f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
