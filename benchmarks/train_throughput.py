"""Training throughput: ``npuforge zoo train`` against a minimal hand-written PyTorch loop
doing the same work, in one run, with 1 and 2 processes.

Both decode the same photos with the same transform and loader (2 spawned workers per
process), run the same model forward and backward (DistributedDataParallel with 2
processes), the same cross entropy with label smoothing and the same SGD step; npuforge's
loop adds its NaN guard (a gradient-norm check), schedule, progress records and the
end-of-epoch evaluation and checkpoints (not timed). Images per second over one epoch of
the training steps, loader start-up included, for both; each measured twice in the order
hand, npuforge, npuforge, hand, the better of each kept.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/train_throughput.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune import SHARED, superclass_tree  # noqa: E402

from npuforge.train import TrainConfig  # noqa: E402
from npuforge.train.loop import Trainer  # noqa: E402


def measure(kind: str, model: str, data: str, out: str, batch: int, steps: int) -> float:
    cfg = TrainConfig(model=model, data=data, output=out, epochs=1, batch_size=batch, lr=0.01, workers=2,
                      val_split=0.1)
    trainer = Trainer(cfg, log=lambda m: None, progress=False)
    trainer.build()
    trainer.plan.num_samples = min(trainer.plan.num_samples, steps * batch * trainer.dist.world)
    if kind == "npuforge":
        rate = trainer.train_epoch(0, None)["images_per_s"]
    else:  # the hand-written loop: the same loader, model, loss and optimizer, nothing else
        net, opt = trainer.net, trainer.opt
        net.train()
        t0 = time.perf_counter()
        loader = trainer._loader(list(trainer.plan.batches(0, trainer.dist.rank)), trainer.train_set)
        images = 0
        for x, y, _ in loader:
            loss = F.cross_entropy(net(x), y, label_smoothing=cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            images += len(y) * trainer.dist.world
        rate = images / (time.perf_counter() - t0)
    trainer.close()
    return rate


def run(kind: str, model: str, data: Path, procs: int, batch: int, steps: int) -> float:
    out = tempfile.mkdtemp(prefix="npuforge-tput-")
    if procs == 1:
        return measure(kind, model, str(data), out, batch, steps)
    exe = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, int(os.environ.get("OMP_NUM_THREADS", "2")) // procs))}
    done = subprocess.run([str(exe), "--standalone", f"--nproc_per_node={procs}", __file__, "--worker", kind, model,
                           str(data), out, str(batch), str(steps)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["rate"]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, model, data, out, batch, steps = sys.argv[2:8]
        rate = measure(kind, model, data, out, int(batch), int(steps))
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps({"rate": rate}))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="efficientnet_lite0,mobilenet_v2")
    ap.add_argument("--batch-size", type=int, default=16, help="per process")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    train_dir, _ = superclass_tree(Path(tempfile.mkdtemp(prefix="npuforge-tput-data-")), SHARED, 0.4, 0)
    print("| model | processes | npuforge zoo train (images/s) | hand-written loop (images/s) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for model in args.models.split(","):
        for procs in (1, 2):
            rates = {"hand": [], "npuforge": []}
            for kind in ("hand", "npuforge", "npuforge", "hand"):  # ABBA: warm caches favour neither
                rates[kind].append(run(kind, model, train_dir, procs, args.batch_size, args.steps))
            hand, ours = max(rates["hand"]), max(rates["npuforge"])
            print(f"| {model} | {procs} | {ours:.2f} | {hand:.2f} | {ours / hand:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
