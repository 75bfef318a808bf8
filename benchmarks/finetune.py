"""Fine-tuning on the 10 superclasses of the shared sample, against a linear probe.

The 500 photos are sorted into ../shared/data/superclasses.tsv's 10 superclasses (dog,
bird, fish, food, artifact, ...) as a class-subfolder tree of links; a seeded split per
class keeps --test-fraction of each class for testing. Each model starts from its
pretrained ImageNet weights and is fine-tuned with ``npuforge zoo train`` (its own
validation split inside the training part); the linear probe is a logistic-regression
head (L-BFGS, L2 chosen on the same validation split) on the frozen pretrained
features of the same training images; the majority class is the rate of the largest
training class on the test split. Everything in one run.

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
import torch.nn.functional as F

from npuforge.train import TrainConfig, train
from npuforge.train.checkpoint import model_from
from npuforge.train.data import rng_for
from npuforge.workflow import preprocess_of, transform_of
from npuforge.zoo import create_model, get_config

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


def features(model, folder: Path, classes: list, preprocess: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled penultimate features (the classifier's input) and labels of a folder."""
    from npuforge.zoo.data import ClassTable, ImageDataset, iter_batches

    head = model.classifier if hasattr(model, "classifier") else model.fc
    grabbed = []
    hook = head.register_forward_pre_hook(lambda m, args: grabbed.append(args[0].flatten(1)))
    ds = ImageDataset(folder, ClassTable(tuple(classes), tuple(classes)))
    xs, ys = [], []
    with torch.no_grad():
        for x, y, _ in iter_batches(ds, transform_of(preprocess), 32):
            model(torch.from_numpy(x))
            xs.append(grabbed.pop())
            ys.append(torch.from_numpy(y))
    hook.remove()
    return torch.cat(xs), torch.cat(ys)


def fit_probe(x, y, classes: int, l2: float) -> torch.nn.Linear:
    head = torch.nn.Linear(x.shape[1], classes)
    opt = torch.optim.LBFGS(head.parameters(), max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(head(x), y) + l2 * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head


def linear_probe(name: str, train_dir: Path, test_dir: Path, classes: list, seed: int) -> dict:
    model = create_model(name, pretrained=True).eval()
    pp = preprocess_of(get_config(name))
    xtr, ytr = features(model, train_dir, classes, pp)
    xte, yte = features(model, test_dir, classes, pp)
    mean, std = xtr.mean(0), xtr.std(0) + 1e-6
    xtr, xte = (xtr - mean) / std, (xte - mean) / std
    order = torch.from_numpy(rng_for(seed, 8).permutation(len(ytr)))
    n_val = len(ytr) // 5
    val, fit = order[:n_val], order[n_val:]
    best = max((1e-4, 1e-3, 1e-2, 1e-1), key=lambda l2: float(
        (fit_probe(xtr[fit], ytr[fit], len(classes), l2)(xtr[val]).argmax(1) == ytr[val]).float().mean()))
    head = fit_probe(xtr, ytr, len(classes), best)
    return {"probe_top1": 100.0 * float((head(xte).argmax(1) == yte).float().mean()), "probe_l2": best}


def test_top1(run: Path, test_dir: Path) -> float:
    model, classes, pp = model_from(run / "best.pt")
    x, y = features(model, test_dir, classes, pp)
    head = model.classifier if hasattr(model, "classifier") else model.fc
    with torch.no_grad():
        return 100.0 * float((head(x).argmax(1) == y).float().mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--models", default="efficientnet_lite0,mobilenet_v2")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
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
    rows = []
    for name in args.models.split(","):
        t = time.perf_counter()
        probe = linear_probe(name, train_dir, test_dir, classes, args.seed)
        probe_s = time.perf_counter() - t
        t = time.perf_counter()
        cfg = TrainConfig(model=name, data=str(train_dir), output=str(work / name), epochs=args.epochs,
                          batch_size=args.batch_size, lr=args.lr, warmup_epochs=1, seed=args.seed, workers=2,
                          val_split=0.15)
        result = train(cfg, log=lambda m: print(f"  {m}", flush=True), progress=False)
        rows.append({"model": name, "finetune_top1": test_top1(work / name, test_dir), **probe,
                     "best_val": result["best_top1"], "train_s": time.perf_counter() - t, "probe_s": probe_s})
        print(rows[-1], flush=True)
    print()
    print("| model | fine-tuned top-1 (test) | linear probe top-1 (test) | majority class | fine-tuning time | probe time |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['finetune_top1']:.1f} % | {r['probe_top1']:.1f} % (L2 {r['probe_l2']:g}) | "
              f"{majority:.1f} % | {r['train_s']:.0f} s ({args.epochs} epochs) | {r['probe_s']:.0f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
