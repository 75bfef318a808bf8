"""npuforge qat: the QAT forward is the integer program (equal to the integer simulator
after rounding, with the quantizer's own integers), gradients reach every weight, the
training loop's resume holds, unlabelled folders distil, bad inputs get one-line errors.

Small: CNNs of a few channels on 16x16 images, CPU."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import npuforge
from npuforge.cli import main
from npuforge.errors import NpuforgeError
from npuforge.passes import optimize
from npuforge.qat import QATProgram
from npuforge.qat.trainer import QATConfig, qat
from npuforge.sim.integer import IntegerSimulator

from test_train import make_folder

PREPROCESS = {"resize_size": 16, "crop_size": [16, 16], "interpolation": "bilinear", "mean": [128.0] * 3,
              "std": [64.0] * 3, "source": "test"}


class Stack(torch.nn.Module):
    """Conv-BN-ReLU stacks, a depthwise ReLU6 with a residual add, a concat of a sigmoid
    (a table) and a plain conv, hardswish (a table), a global mean and a classifier."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8, eps=1e-3)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.BatchNorm2d(8)
        self.c3, self.c4 = torch.nn.Conv2d(8, 4, 1), torch.nn.Conv2d(8, 4, 1)
        self.fc = torch.nn.Linear(8, classes)

    def forward(self, x):
        a = torch.relu(self.b1(self.c1(x)))
        b = torch.nn.functional.relu6(self.b2(self.c2(a))) + a
        c = torch.cat([torch.sigmoid(self.c3(b)), self.c4(b)], 1)
        return self.fc(torch.nn.functional.hardswish(c).mean((2, 3)))


def float_graph(classes: int = 5, seed: int = 0):
    torch.manual_seed(seed)
    net = Stack(classes)
    for m in net.modules():  # statistics away from the identity, so folding them matters
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    graph = optimize(npuforge.from_torch(net.eval(), torch.zeros(1, 3, 16, 16)))[0]
    graph.metadata["preprocess"] = dict(PREPROCESS)
    return graph


def calibration(seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, 3, 16, 16)).astype(np.float32) for _ in range(2)]


CONFIGS = [{"granularity": "per-tensor"}, {"granularity": "per-channel"},
           {"granularity": "per-channel", "activation_dtype": "int8", "symmetric": True},
           {"granularity": "per-channel", "activation_dtype": "int8", "tflite_multipliers": True},
           {"granularity": "per-tensor", "equalize": True, "bias_correction": True},  # QAT's start: quantize's
           {"granularity": "per-tensor", "equalize": True, "bias_correction": True, "adaround": True,
            "adaround_iters": 40},
           {"granularity": "per-channel", "adaround": True, "adaround_iters": 40}]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_qat_forward_is_the_integer_program(config):
    graph = float_graph()
    program = QATProgram(graph, calibration(), config)
    x = np.random.default_rng(1).standard_normal((3, 3, 16, 16)).astype(np.float32) * 1.5
    with torch.enable_grad():
        y = program(torch.from_numpy(x))
    q = program.quantized()
    assert {n.op for n in q.nodes} >= {"Conv", "Add", "Concat", "Sigmoid", "HardSwish", "Gemm"}
    ref = IntegerSimulator(q).run({q.inputs[0]: x})[q.outputs[0]]
    np.testing.assert_array_equal(y.detach().numpy(), ref)  # the same codes, dequantized
    with torch.no_grad():  # the evaluation forward: the simulator alone
        np.testing.assert_array_equal(program(torch.from_numpy(x)).numpy(), ref)
    # the integers are the quantizer's own decision, with its nearest multipliers (QAT keeps those)
    config = dict(config, ort_multipliers=False) if not config.get("tflite_multipliers") else config
    expected = npuforge.quantize(graph, calibration(), config, optimize=False)
    if config.get("adaround"):  # a start whose rounding is not the nearest: the trained weights carry it
        nearest = npuforge.quantize(graph, calibration(), {k: v for k, v in config.items() if "adaround" not in k},
                                    optimize=False)
        assert sum(int(np.count_nonzero(expected.values[a.quant["weight"]].data
                                        != nearest.values[b.quant["weight"]].data))
                   for a, b in zip(expected.nodes, nearest.nodes) if "weight" in a.quant) > 10
    for mine, theirs in zip(q.nodes, expected.nodes):
        assert mine.quant.keys() == theirs.quant.keys(), mine.name
        for role in mine.quant:
            np.testing.assert_array_equal(np.asarray(q.values[mine.quant[role]].data),
                                          np.asarray(expected.values[theirs.quant[role]].data), err_msg=role)


def test_gradients_reach_every_weight_and_training_moves_the_integers():
    program = QATProgram(float_graph(), calibration(), {"granularity": "per-tensor"})
    before = {n.name: np.array(program.quantized().values[n.quant["weight"]].data)
              for n in program.quantized().nodes if "weight" in n.quant}
    x = torch.from_numpy(calibration(2)[0])
    target = program.teacher(x).argmax(1)
    opt = torch.optim.SGD(program.parameters(), lr=0.05)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(program(x), (target + 1) % 5)  # somewhere else to go
        opt.zero_grad()
        loss.backward()
        assert all(w.grad is not None and float(w.grad.abs().sum()) > 0 for w in program.weights)
        opt.step()
    after = program.quantized()
    moved = [n.name for n in after.nodes if "weight" in n.quant
             and not np.array_equal(before[n.name], after.values[n.quant["weight"]].data)]
    assert len(moved) == len(before), moved


def test_a_saturating_output_passes_no_gradient():
    """Straight through inside the output's grid, zero where it saturates at an edge: the
    weight gradient of sum(y) is the convolution's with the output gradient 1 inside, 0 at
    qmin / qmax."""
    torch.manual_seed(0)
    graph = optimize(npuforge.from_torch(torch.nn.Conv2d(3, 4, 3).eval(), torch.zeros(1, 3, 16, 16)))[0]
    program = QATProgram(graph, calibration(), {"granularity": "per-tensor"})
    x = torch.from_numpy(calibration(3)[0] * 3)  # beyond the calibrated range: many outputs saturate
    program(x).sum().backward()
    q = program.quantized()
    conv = q.nodes[0]
    xp, yp, wp = (q.values[n].quant for n in (conv.inputs[0], conv.outputs[0], conv.inputs[1]))
    codes = IntegerSimulator(q).run({q.inputs[0]: x.numpy()}, dequantize=False)[q.outputs[0]]
    inside = torch.from_numpy(((codes > yp.qmin) & (codes < yp.qmax)).astype(np.float32))
    assert 0.1 < float(inside.mean()) < 0.9
    w = torch.from_numpy(wp.dequantize(wp.quantize(q.values[conv.inputs[1]].data))).requires_grad_()
    xq = torch.from_numpy(xp.dequantize(xp.quantize(x.numpy())))
    (torch.nn.functional.conv2d(xq, w) * inside).sum().backward()
    torch.testing.assert_close(program.weights[0].grad, w.grad)


def test_learnt_scales_get_lsq_gradients_and_the_program_follows_them():
    """learn_scales: the gradient of sum(y) by t = log s of a convolution's output group is
    LSQ's by s (the sum of q - zp - x / s inside the grid and of q - zp where it saturates,
    times 1 / sqrt(N Qp)) divided by s;
    a moved scale is the program's scale, and the forward is still the integer simulator."""
    torch.manual_seed(0)
    graph = optimize(npuforge.from_torch(torch.nn.Conv2d(3, 4, 3).eval(), torch.zeros(1, 3, 16, 16)))[0]
    program = QATProgram(graph, calibration(), {"granularity": "per-tensor"}, learn_scales=True)
    assert len(program.groups) == 1  # the output; the input keeps its grid
    x = torch.from_numpy(calibration(3)[0] * 3)  # many outputs saturate: both branches count
    program(x).sum().backward()
    q = program.quantized()
    conv = q.nodes[0]
    xp, yp, wp, bp = (q.values[n].quant for n in (conv.inputs[0], conv.outputs[0], conv.inputs[1], conv.inputs[2]))
    codes = IntegerSimulator(q).run({q.inputs[0]: x.numpy()}, dequantize=False)[q.outputs[0]].astype(np.float64)
    w = wp.dequantize(wp.quantize(q.values[conv.inputs[1]].data)).astype(np.float64)
    b = bp.dequantize(bp.quantize(q.values[conv.inputs[2]].data)).astype(np.float64)
    xq = xp.dequantize(xp.quantize(x.numpy())).astype(np.float64)
    approx = torch.nn.functional.conv2d(torch.from_numpy(xq), torch.from_numpy(w), torch.from_numpy(b)).numpy()
    s, zp = float(yp.scale), float(yp.zero_point)
    inside = (codes > yp.qmin) & (codes < yp.qmax)
    assert 0.1 < inside.mean() < 0.9
    per = np.where(inside, codes - zp - approx / s, codes - zp)
    expected = per.sum() / (s * np.sqrt(codes[0].size * (yp.qmax - zp)))  # LSQ's step for s, relative to s
    assert float(program.log_scales.grad[0]) == pytest.approx(expected, rel=1e-4)
    with torch.no_grad():
        program.log_scales.fill_(0.1)
    moved = program.quantized()
    assert float(moved.values[conv.outputs[0]].quant.scale) == pytest.approx(s * np.exp(0.1), rel=1e-6)
    with torch.enable_grad():
        y = program(x)
    np.testing.assert_array_equal(y.detach().numpy(), IntegerSimulator(moved).run({moved.inputs[0]: x.numpy()})[
        moved.outputs[0]])


def test_learnt_scales_train_and_write_their_program(tmp_path):
    """Every group of the stack gets a gradient; a few steps move the scales, and the IR
    written evaluates as the QAT forward does."""
    program = QATProgram(float_graph(), calibration(), {"granularity": "per-tensor"}, learn_scales=True)
    x = torch.from_numpy(calibration(2)[0])
    target = program.teacher(x).argmax(1)
    opt = torch.optim.SGD(program.parameters(), lr=0.05)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(program(x), (target + 1) % 5)
        opt.zero_grad()
        loss.backward()
        assert torch.isfinite(program.log_scales.grad).all() and int((program.log_scales.grad != 0).sum()) >= 4
        opt.step()
    assert float(program.log_scales.detach().abs().min()) > 0
    q = program.quantized()
    with torch.no_grad():
        np.testing.assert_array_equal(program(x).numpy(), IntegerSimulator(q).run({q.inputs[0]: x.numpy()})[
            q.outputs[0]])


def qat_config(root: Path, data, **kw) -> QATConfig:
    base = dict(model="stack", data=str(data), output=str(root / "run"), result=str(root / "q.nfir"), epochs=2,
                batch_size=4, lr=0.02, workers=0, val_split=0.25, num_calib=8, label_smoothing=0.0,
                quant={"granularity": "per-tensor"})
    return QATConfig(**{**base, **kw})


def quiet(msg):
    pass


def test_training_on_labels_lowers_the_loss_and_writes_the_program_it_evaluated(tmp_path):
    data = make_folder(tmp_path / "data", per_class=8)
    result = qat(qat_config(tmp_path, data, labels=True, epochs=5, lr=0.2), float_graph(classes=3),
                 log=quiet, progress=False)
    losses = [r["train_loss"] for r in result["history"]]
    assert losses[-1] < 0.8 * losses[0], losses
    q = npuforge.load(tmp_path / "q.nfir")
    assert q.metadata["qat"]["best_epoch"] == result["best_epoch"]
    # the written IR, run by the integer simulator, scores what QAT's evaluation counted
    from npuforge.train.data import SampleSet, collate, eval_batches, split_samples
    from npuforge.workflow import transform_of

    best = result["best_epoch"]
    trainer_val = result["history"][best - 1] if best else result["start"]
    samples = [(str(p), ["blue", "green", "red"].index(p.parent.name)) for p in sorted(data.rglob("*.png"))]
    _, val = split_samples(samples, 0.25, 0)
    images = SampleSet(val, transform_of(PREPROCESS), 0, train=False)
    x, y, _ = collate([images[k] for k in next(iter(eval_batches(len(val), len(val), 1, 0)))])
    logits = IntegerSimulator(q).run({q.inputs[0]: x.numpy()})[q.outputs[0]]
    assert int((logits.argmax(1) == y.numpy()).sum()) == trainer_val["val_correct"]


@pytest.mark.slow
def test_killed_and_resumed_equals_uninterrupted(tmp_path):
    data = make_folder(tmp_path / "data", per_class=8)
    whole = tmp_path / "whole"
    qat(qat_config(whole, data), float_graph(), log=quiet, progress=False)
    parts = tmp_path / "parts"
    stopped = qat(qat_config(parts, data), float_graph(), log=quiet, progress=False, stop_after_step=5)
    assert stopped["stopped"]
    qat(qat_config(parts, data, resume=True), float_graph(), log=quiet, progress=False)
    a = torch.load(whole / "run" / "last.pt", weights_only=True)["model"]
    b = torch.load(parts / "run" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the same integers written (the text differs only in the calibration's timing)
    assert (whole / "q.safetensors").read_bytes() == (parts / "q.safetensors").read_bytes()


def test_flipped_weights_are_placed_where_a_squared_error_scale_keeps_adaround_s_codes():
    """Per tensor the weight scale is chosen by squared error, so moving AdaRound's flipped
    weights can move it and every code with it: placed a quarter step inside their chosen
    interval, this tensor's scale moves; ``place_at_codes`` places them deeper until the
    quantizer's decision is AdaRound's."""
    from npuforge.qat.program import place_at_codes, within_codes
    from npuforge.quant.params import weight_params
    from npuforge.quant.quantize import _weight_clip

    def decide(w):  # quantize's per-tensor weight decision
        wp = weight_params(w, None, clip=_weight_clip(w, None, "mse", 127))
        return wp, wp.quantize(w)

    rng = np.random.default_rng(1140)
    w = (rng.standard_normal(72) * 0.1).astype(np.float32)
    w[0] = 0.9  # an outlier: the clipping bound is a choice
    wp, nearest = decide(w)
    frac = w / np.asarray(wp.scale) - nearest
    flip = np.argsort(-np.abs(frac))[:6]  # the six nearest a boundary, rounded the other way
    codes = nearest.copy()
    codes[flip] += np.sign(frac[flip]).astype(codes.dtype)
    assert not np.array_equal(decide(within_codes(w, codes, wp, 0.25))[1], codes)  # a quarter step: the scale moves
    placed = place_at_codes({"w": (w, wp)}, {"w": codes}, lambda ws: {n: decide(v)[1] for n, v in ws.items()})
    np.testing.assert_array_equal(decide(placed["w"])[1], codes)
    kept = np.ones(w.size, bool)
    kept[flip] = False
    np.testing.assert_array_equal(placed["w"][kept], w[kept])  # only the flipped weights move


def test_an_adaround_start_is_learnt_once_and_resumes_from_its_cache(tmp_path):
    """--adaround: QAT starts from AdaRound's program (its integers: the forward test above),
    whose rounding is cached in the run directory; a resumed run reuses it and ends where
    the uninterrupted one does."""
    data = make_folder(tmp_path / "data", per_class=8)
    quant = {"granularity": "per-tensor", "adaround": True, "adaround_iters": 20}
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    qat(qat_config(whole, data, quant=quant, epochs=1), float_graph(), log=quiet, progress=False)
    assert npuforge.load(whole / "q.nfir").metadata["qat"]["start"] == "PTQ + AdaRound"
    layers = len(list((whole / "run" / "adaround").glob("*.npy")))
    assert layers == 5
    assert qat(qat_config(parts, data, quant=quant, epochs=1), float_graph(), log=quiet, progress=False,
               stop_after_step=2)["stopped"]
    lines = []
    qat(qat_config(parts, data, quant=quant, epochs=1, resume=True), float_graph(), log=lines.append,
        progress=False)
    assert any(f"({layers} of {layers} layers from the cache)" in line for line in lines), lines
    kept = [re.search(r"start with (\d+) of AdaRound's (\d+) weight codes", line) for line in lines]
    assert any(m and m[1] == m[2] for m in kept), lines
    assert (whole / "q.safetensors").read_bytes() == (parts / "q.safetensors").read_bytes()


def test_an_unlabelled_folder_trains_by_distillation(tmp_path):
    flat = tmp_path / "photos"
    flat.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(flat / f"shot{i}.png")
    result = qat(qat_config(tmp_path, flat, val_split=0.25), float_graph(), log=quiet, progress=False)
    assert not result["stopped"] and (tmp_path / "q.nfir").is_file()
    assert all(r["val_total"] == 3 for r in result["history"])  # agreement with the float model's top-1
    with pytest.raises(NpuforgeError, match="--labels: .* has no labels"):
        qat(qat_config(tmp_path, flat, labels=True), float_graph(), log=quiet, progress=False)


def test_distillation_ranks_epochs_by_validation_kl_and_keeps_the_start_when_every_epoch_drifts(tmp_path):
    """Epochs rank by the integer program's KL divergence from the float model on the
    validation images (lower first), the PTQ start among them as epoch 0; with a learning
    rate that wrecks the weights, the program written is the start's."""
    data = make_folder(tmp_path / "data", per_class=8)
    graph = float_graph(classes=3)
    result = qat(qat_config(tmp_path, data, lr=50.0), graph, log=quiet, progress=False)
    kls = [result["start"]["val_kl"]] + [r["val_kl"] for r in result["history"]]
    assert all(kl >= 0 for kl in kls) and min(kls[1:]) > kls[0], kls
    assert result["best_epoch"] == 0 and result["best_kl"] == kls[0]
    q = npuforge.load(tmp_path / "q.nfir")
    assert q.metadata["qat"]["best_epoch"] == 0 and q.metadata["qat"]["val_kl"] == kls[0]
    # the written weights are those QAT started from, not the last epoch's
    from npuforge.train import checkpoint as ckpt

    def trained(state):
        return [state[f"weights.{k}"].numpy() for k in range(sum(k.startswith("weights.") for k in state))]

    start, last = (trained(ckpt.load(tmp_path / "run" / f)["model"]) for f in ("epoch_000.pt", "last.pt"))
    written = [np.asarray(q.values[n.inputs[k]].data) for n in q.nodes if "weight" in n.quant
               for k in (1, 2) if len(n.inputs) > k and n.inputs[k]]
    assert len(written) == len(start)
    assert all(np.array_equal(w, s0) for w, s0 in zip(written, start))
    assert not all(np.array_equal(w, s1) for w, s1 in zip(written, last))


def test_distillation_holds_out_images_of_a_folder_with_one_image_per_class(tmp_path):
    """ImageNet-style data (a class of one image each) still gets its validation images when
    the labels are not what QAT trains on; a split per class would keep none."""
    rng = np.random.default_rng(0)
    for k in range(12):
        (tmp_path / "data" / f"class{k:02d}").mkdir(parents=True)
        photo = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
        Image.fromarray(photo).save(tmp_path / "data" / f"class{k:02d}" / "a.png")
    result = qat(qat_config(tmp_path, tmp_path / "data", epochs=1), float_graph(classes=12), log=quiet, progress=False)
    assert result["start"]["val_total"] == 3 and result["history"][0]["val_total"] == 3
    # --val DIR: all of its images validate, all of --data trains
    val = make_folder(tmp_path / "val", per_class=2)
    result = qat(qat_config(tmp_path / "second", tmp_path / "data", epochs=1, val=str(val)), float_graph(classes=12),
                 log=quiet, progress=False)
    assert result["start"]["val_total"] == 6 and result["history"][0]["val_total"] == 6
    assert npuforge.load(tmp_path / "second" / "q.nfir").metadata["qat"]["training_images"] == 12


def test_bad_inputs_get_one_line_errors(tmp_path, capsys):
    graph = float_graph()
    npuforge.save(graph, tmp_path / "f.nfir")
    q = npuforge.quantize(graph, calibration(), optimize=False)
    npuforge.save(q, tmp_path / "q.nfir")
    empty = tmp_path / "empty"
    empty.mkdir()
    data = make_folder(tmp_path / "data", per_class=2)
    cases = [
        (["qat", str(tmp_path / "q.nfir"), "--data", str(data), "-o", str(tmp_path / "o.nfir")], "already quantized"),
        (["qat", str(tmp_path / "f.nfir"), "--data", str(empty), "-o", str(tmp_path / "o.nfir")], "no images found"),
        (["qat", str(tmp_path / "f.nfir"), "--data", str(tmp_path / "nowhere"), "-o", str(tmp_path / "o.nfir")],
         "no such folder"),
        (["qat", str(tmp_path / "f.nfir"), "--data", str(data), "-o", str(tmp_path / "o.nfir"), "--batch-size",
          "64", "-q"], "fewer than one batch"),
        (["qat", str(tmp_path / "f.nfir"), "--data", str(data), "-o", str(tmp_path / "o.nfir"), "--epochs", "0"],
         "must be at least 1"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        errors = [line for line in err.splitlines() if line.startswith("npuforge: error:")]
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "o.nfir").exists()
    shutil.rmtree(tmp_path / "data")


@pytest.mark.slow
def test_target_drop_climbs_the_recipes_in_order_and_stops_at_the_first_that_meets_it(tmp_path, capsys,
                                                                                      monkeypatch):
    """Each rung really quantizes (QAT included) and is scored on the held-out images; the
    scores are then replaced by a schedule (float 100, rungs 50, 60, 70, 100) so the climb is
    known: with D = 0 only QAT meets it. Without labels of the model's classes the drop is
    100 - top-1 agreement with the float model."""
    import json

    from npuforge.quant import ladder

    graph = float_graph(classes=3)
    npuforge.save(graph, tmp_path / "f.nfir")
    data = make_folder(tmp_path / "data", per_class=6)
    base = ["quantize", str(tmp_path / "f.nfir"), "--calib", str(data), "--held-out", "6", "--num-calib", "12",
            "--granularity", "per-tensor", "--qat-epochs", "1", "--batch-size", "4", "-q", "--json"]
    assert main(base + ["-o", str(tmp_path / "easy.nfir"), "--target-drop", "100"]) == 0
    easy = json.loads(capsys.readouterr().out)
    assert [r["rung"] for r in easy["rungs"]] == ["defaults"] and easy["chosen"] == "defaults"

    real, scores = ladder._top1_or_agreement, iter([100.0, 50.0, 60.0, 70.0, 100.0])
    seen = []

    def scheduled(logits, labels, reference):
        seen.append(real(logits, labels, reference))
        return next(scores)

    monkeypatch.setattr(ladder, "_top1_or_agreement", scheduled)
    assert main(base + ["-o", str(tmp_path / "hard.nfir"), "--target-drop", "0"]) == 0
    hard = json.loads(capsys.readouterr().out)
    assert [r["rung"] for r in hard["rungs"]] == [name for name, _ in ladder.RUNGS]
    assert [r["drop"] for r in hard["rungs"]] == [50.0, 40.0, 30.0, 0.0] and hard["chosen"] == "QAT"
    assert len(seen) == 5 and all(0 <= v <= 100 for v in seen)
    q = npuforge.load(tmp_path / "hard.nfir")
    assert q.metadata["quantization"]["target_drop"]["rungs"] == hard["rungs"]
    assert "qat" in q.metadata  # the QAT rung's IR was written, started from the better of the first two rungs
    assert set(q.metadata["qat"]["start_candidates"]) == {"PTQ", "PTQ + equalize + bias correction"}
    assert q.metadata["qat"]["validation_images"] == 2  # a fifth of the 12 calibration images
    assert main(base + ["-o", str(tmp_path / "x.nfir"), "--target-drop", "1", "--equalize"]) == 2
    assert "--target-drop picks the recipe itself; drop --equalize" in capsys.readouterr().err


def test_best_start_starts_from_the_ptq_program_closer_to_the_float_model_on_validation(tmp_path):
    data = make_folder(tmp_path / "data", per_class=8)
    lines = []  # seed 2: a stack whose program equalization and bias correction change (seed 0's they do not)
    result = qat(qat_config(tmp_path, data, lr=50.0, epochs=1, best_start=True), float_graph(classes=3, seed=2),
                 log=lines.append, progress=False)
    meta = npuforge.load(tmp_path / "q.nfir").metadata["qat"]
    tried = meta["start_candidates"]
    assert set(tried) == {"PTQ", "PTQ + equalize + bias correction"} and len(set(tried.values())) == 2, tried
    closer = min(tried, key=tried.get)
    assert meta["start"] == closer and any(f"starting from {closer}," in line for line in lines)
    # the start QAT ranked as epoch 0 is that program (this learning rate wrecks every epoch)
    assert result["best_epoch"] == 0 and result["start"]["val_kl"] == tried[closer]
    with pytest.raises(NpuforgeError, match="--best-start tries the start with and without"):
        qat_config(tmp_path, data, best_start=True, quant={"granularity": "per-tensor", "equalize": True})
    with pytest.raises(NpuforgeError, match="--best-start picks the start on the validation images"):
        qat_config(tmp_path, data, best_start=True, val_split=0.0)
