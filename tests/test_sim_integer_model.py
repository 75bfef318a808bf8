"""The integer simulator on the whole pretrained EfficientNet-Lite0 (per-channel,
100 calibration images) against fake-quant, on a subset of the evaluation images.
The full 400-image figures are in docs/simulator.md with their command."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import npuforge
from npuforge.cli import main as cli_main
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.integer import IntegerSimulator
from npuforge.sim.lowered import LoweredSimulator

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quantized(imagenet_sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("l0q") / "l0q.nfir"
    assert cli_main(["quantize", "efficientnet_lite0", "--calib", str(imagenet_sample), "--num-calib", "100",
                     "--no-ort-multipliers", "-o", str(out)]) == 0  # the nearest: channels apart to test
    return npuforge.load(out)


def test_integer_agrees_with_fake_quant(quantized, imagenet_sample):
    from npuforge.workflow import transform_of
    from npuforge.zoo.data import ImageDataset, iter_batches

    torch.set_num_threads(2)
    dataset = ImageDataset(imagenet_sample, None, limit=25, skip=100)
    x, y, _ = next(iter_batches(dataset, transform_of(quantized.metadata["preprocess"]), 25, 2))
    name, out = quantized.inputs[0], quantized.outputs[0]
    sim = IntegerSimulator(quantized, "fixedpoint")
    logits = sim.run({name: x})[out]
    fake = run_fake_quant(quantized, {name: x})[out]
    assert set(sim.kernels.values()) == {"float32"}  # every accumulator proven exact in float32
    # Fake-quant runs on float kernels, which differ by CPU, so a code on a rounding
    # boundary may land either side; what holds everywhere: the logits stay on the
    # output's grid within a few steps of fake-quant (0.46 steps on average over 500
    # images, docs/simulator.md), and the top-1 differs only where the two best
    # fake-quant logits are closer than the two results differ.
    step = float(quantized.values[out].quant.scale)
    for got, ref in ((logits, fake), (IntegerSimulator(quantized, "onnx").run({name: x[:8]})[out], fake[:8])):
        diff = np.abs(got - ref)
        assert diff.max() <= 12 * step and diff.mean() <= 1.0 * step, (diff.max() / step, diff.mean() / step)
        flipped = got.argmax(1) != ref.argmax(1)
        ranked = np.sort(ref, axis=1)
        assert (ranked[flipped, -1] - ranked[flipped, -2] <= 2 * diff.max(axis=1)[flipped]).all()
    print(f"\ninteger vs fake-quant on 25 images: top-1 agreement {(logits.argmax(1) == fake.argmax(1)).mean():.0%}, "
          f"mean |logit diff| {np.abs(logits - fake).mean() / step:.2f} steps; top-1 integer "
          f"{(logits.argmax(1) == y).mean():.0%}, fake-quant {(fake.argmax(1) == y).mean():.0%}")


def test_lowered_simulator_is_bit_exact_on_lite0(quantized, imagenet_sample):
    """The ONNX Runtime fast path computes the same codes as the plain simulator on real
    images: ONNX Runtime's own integer operators in every rounding mode (each Conv a
    QLinearConv for the channels it reproduces, the rest apart; fewer apart with
    the multipliers quantize picks by default), and the float lowering."""
    from npuforge.workflow import transform_of
    from npuforge.zoo.data import ImageDataset, iter_batches

    import copy

    from npuforge.quant.ort_multipliers import match_multipliers

    dataset = ImageDataset(imagenet_sample, None, limit=8, skip=100)
    x, _, _ = next(iter_batches(dataset, transform_of(quantized.metadata["preprocess"]), 8, 2))
    name, out = quantized.inputs[0], quantized.outputs[0]
    matched = copy.deepcopy(quantized)  # as quantize leaves it by default
    report = match_multipliers(matched)
    assert report["matched"] >= 0.9 * report["channels"] and report["max_code_change"] <= 2**-10
    apart = {}
    for graph, mode, form in ((quantized, "fixedpoint", "qoperator"), (quantized, "single", "qoperator"),
                              (quantized, "onnx", "qoperator"), (quantized, "fixedpoint", "float"),
                              (matched, "fixedpoint", "qoperator")):
        low = LoweredSimulator(graph, mode, form=form)
        assert low.form == form
        if form == "qoperator":
            convs = [how for node, how in low.lowering.items() if node.endswith(("Conv", "Gemm"))]
            # (more than half the channels apart: all of them on MatMulInteger, no QLinearConv)
            assert len(convs) == 50 and all(how.startswith("QLinearConv") or "reproduces: all" in how for how in convs)
            apart[graph is matched, mode] = sum(1 for how in convs if ";" in how or "reproduces: all" in how)
        np.testing.assert_array_equal(low.run({name: x}, dequantize=False)[out],
                                      IntegerSimulator(graph, mode).run({name: x}, dequantize=False)[out])
    # (onnx: two depthwise layers have a channel whose accumulators may leave int32)
    assert apart[False, "onnx"] <= 2 and apart[True, "fixedpoint"] < apart[False, "fixedpoint"]
