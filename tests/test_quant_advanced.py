"""Cross-layer equalization, bias correction and AdaRound on small depthwise-separable
networks: exactness of the rewrites, their effect on the quantization error, the
per-channel Clip bounds they create (float, ONNX Runtime, integer simulator), seeding
and resuming."""

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings, strategies as st

import npuforge
from npuforge.errors import CheckError
from npuforge.export import to_onnx, to_qdq_onnx
from npuforge.passes import optimize
from npuforge.quant.equalize import equalize, find_pairs
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.integer import IntegerSimulator


class Separable(torch.nn.Module):
    """stem conv -> ReLU6 -> depthwise -> ReLU6 -> pointwise -> ReLU -> GAP -> Linear, with
    channel ranges spread over orders of magnitude, as trained depthwise layers have."""

    def __init__(self, seed: int, act=torch.nn.ReLU6):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), act())
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.BatchNorm2d(16),
                                      act())
        self.pw = torch.nn.Sequential(torch.nn.Conv2d(16, 24, 1), torch.nn.ReLU())
        self.pool = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.fc = torch.nn.Linear(24, 10)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.weight.copy_(10 ** (torch.rand(m.num_features, generator=g) * 3 - 1.5))
                    m.bias.copy_(torch.rand(m.num_features, generator=g) * 0.5)
                    m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                    m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)

    def forward(self, x):
        return self.fc(self.pool(self.pw(self.dw(self.stem(x)))))


def graph_of(seed: int, act=torch.nn.ReLU6):
    torch.manual_seed(seed)
    return optimize(npuforge.from_torch(Separable(seed, act).eval(), torch.zeros(1, 3, 12, 12)))[0]


def data(seed: int, n: int = 4, batch: int = 8):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, 3, 12, 12)).astype(np.float32) for _ in range(n)]


def run(g, x):
    return g.run({g.inputs[0]: x})[g.outputs[0]]


def sqnr(ref, out) -> float:
    return float(10 * np.log10((ref ** 2).sum() / ((ref - out) ** 2).sum()))


# -- cross-layer equalization -------------------------------------------------------------

@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), act=st.sampled_from([torch.nn.ReLU6, torch.nn.ReLU, torch.nn.Identity]))
def test_equalization_keeps_the_float_function_and_matches_channel_ranges(seed, act):
    g = graph_of(seed, act)
    e = copy.deepcopy(g)
    report = equalize(e)
    e.check()
    assert report["pairs"] == 3  # stem-dw, dw-pw, pw-(GlobalAveragePool, Flatten)-fc
    x = data(seed + 1, 1)[0]
    ref = run(g, x)
    np.testing.assert_allclose(run(e, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert report["coarse_channels_after"] <= report["coarse_channels_before"]
    for pair in find_pairs(e)[0]:  # each pair's two sides now have equal per-channel ranges (last pass within 2%)
        w1 = e.values[pair.first.inputs[1]].data
        r1 = np.abs(w1.reshape(w1.shape[0], -1) if pair.first.op == "Conv" else w1).max(axis=1)
        w2 = e.values[pair.second.inputs[1]].data
        r2 = np.abs(w2).max(axis=(1, 2, 3)) if pair.second.attrs.get("group", 1) > 1 else \
            np.abs(w2.reshape(w2.shape[0], w2.shape[1], -1) if pair.second.op == "Conv" else w2).max(
                axis=(0, 2) if pair.second.op == "Conv" else 0)
        np.testing.assert_allclose(r1, r2, rtol=0.02)


def test_relu6_bounds_become_per_channel_and_run_everywhere_alike():
    g = graph_of(3)
    e = copy.deepcopy(g)
    equalize(e)
    stem = e.nodes[0]
    lo, hi = stem.attrs["activation_params"]
    assert lo == 0.0 and isinstance(hi, list) and len(hi) == 16 and len(set(hi)) > 1
    x = data(4, 1)[0]
    sess = ort.InferenceSession(to_onnx(e).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {e.inputs[0]: x})[0], run(e, x), rtol=1e-5, atol=1e-5)
    bad = copy.deepcopy(e)
    bad.nodes[0].attrs["activation_params"] = [0.0, hi[:3]]
    with pytest.raises(CheckError, match="3 per-channel values for 16 output channels"):
        bad.check()


def unbalance(g, seed: int):
    """The same function with the depthwise layer's channels scaled by 10^U(-1.5, 1.5) and the
    pointwise layer's inputs by the inverse: what BatchNorm folding leaves in trained networks."""
    g = copy.deepcopy(g)
    dw = next(n for n in g.nodes if n.op == "Conv" and n.attrs["group"] > 1)
    pw = next(n for n in g.nodes if n.inputs[0] == dw.outputs[0])
    c = 10 ** np.random.default_rng(seed).uniform(-1.5, 1.5, 16).astype(np.float32)
    for name, shape in ((dw.inputs[1], (-1, 1, 1, 1)), (dw.inputs[2], (-1,))):
        g.values[name].data = g.values[name].data * c.reshape(shape)
    g.values[pw.inputs[1]].data = g.values[pw.inputs[1]].data / c.reshape(1, -1, 1, 1)
    return g


def test_equalization_is_what_per_tensor_weights_need():
    balanced = graph_of(7, torch.nn.ReLU)
    g = unbalance(balanced, 7)
    calib, x = data(8), data(9, 1)[0]
    ref = run(g, x)
    np.testing.assert_allclose(ref, run(balanced, x), rtol=1e-4, atol=1e-5)
    config = {"granularity": "per-tensor", "weight_method": "minmax", "int16": g.outputs}  # fine output steps
    plain = npuforge.quantize(g, calib, config)
    equal = npuforge.quantize(g, calib, {**config, "equalize": True})
    fq = lambda q: run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]  # noqa: E731
    assert sqnr(ref, fq(equal)) > sqnr(ref, fq(plain)) + 6  # at least 4x less error energy
    assert equal.metadata["quantization"]["equalize"]["pairs"] == 3


@pytest.mark.parametrize("rounding", ["onnx", "fixedpoint"])
def test_integer_simulator_applies_per_channel_clip_bounds(rounding):
    g = graph_of(11)
    q = npuforge.quantize(g, data(12), {"granularity": "per-tensor", "equalize": True})
    assert any(isinstance(n.attrs.get("activation_params", [None])[-1], list) for n in q.nodes)
    x = data(13, 1)[0]
    sim = IntegerSimulator(q, rounding=rounding)
    out = sim.run({q.inputs[0]: x})[q.outputs[0]]
    fq = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    step = float(q.values[q.outputs[0]].quant.scale)
    assert np.abs(out - fq).max() <= 3 * step
    # ... and so does the QDQ export (per-channel bounds as Max / Min) in ONNX Runtime, fusions off
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(to_qdq_onnx(q).SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert np.abs(sess.run(None, {q.inputs[0]: x})[0] - fq).max() <= 2 * step


# -- bias correction ------------------------------------------------------------------------

def test_variants_that_differ_after_calibration_share_it_and_equal_quantize():
    """quantize_variants gives quantize's graphs byte for byte (IR text and weights), calibrating
    once for the configurations that differ only in steps after calibration."""
    import importlib

    from npuforge.ir.textio import dumps
    from npuforge.quant.config import QuantConfig

    quantize_mod = importlib.import_module("npuforge.quant.quantize")  # (the package exports its function)

    g = graph_of(21)
    calib = data(22, n=4)
    configs = [QuantConfig(granularity="per-tensor", equalize=True),
               QuantConfig(granularity="per-tensor", equalize=True, bias_correction=True),
               QuantConfig(granularity="per-tensor")]
    calls = []
    real = quantize_mod._calibrated
    try:
        quantize_mod._calibrated = lambda *a, **k: calls.append(1) or real(*a, **k)
        shared = quantize_mod.quantize_variants(g, calib, configs, log=lambda m: None)
    finally:
        quantize_mod._calibrated = real
    assert len(calls) == 2
    for config, got in zip(configs, shared):
        want = npuforge.quantize(g, calib, config, log=lambda m: None)
        assert dumps(got, "w", "") == dumps(want, "w", "")
        for name, v in want.values.items():
            if v.is_const:
                np.testing.assert_array_equal(got.values[name].data, v.data)


def test_bias_correction_removes_the_mean_output_shift():
    g = graph_of(21)
    calib = data(22, n=6)
    config = {"granularity": "per-tensor", "weight_method": "minmax"}
    plain = npuforge.quantize(g, calib, config)
    fixed = npuforge.quantize(g, calib, {**config, "bias_correction": True})
    report = fixed.metadata["quantization"]["bias_correction"]
    assert report["corrected"] == 4 and report["mean_abs_shift"] > 0
    x = np.concatenate(calib)
    ref = run(g, x)

    def shift(q):
        out = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
        return float(np.abs((out - ref).mean(axis=0)).mean())

    assert shift(fixed) < 0.5 * shift(plain)
    for n in fixed.nodes:  # the int32 bias follows the corrected float bias
        if "bias" in n.quant:
            b = fixed.values[n.inputs[2]]
            np.testing.assert_array_equal(fixed.values[n.quant["bias"]].data, b.quant.quantize(b.data))


# -- AdaRound -----------------------------------------------------------------------------

def layer_errors(g, q, calib):
    """Per compute layer: squared error of its output with quantized weights, on float inputs."""
    from npuforge.sim.float_exec import execute

    x = np.concatenate(calib)
    outs = [n.outputs[0] for n in q.nodes if "weight" in n.quant]
    ref = execute(g, {g.inputs[0]: x}, outs)
    got = execute(q, {q.inputs[0]: x}, outs, const_hook=lambda v, t: torch.from_numpy(
        v.quant.dequantize(v.quant.quantize(v.data))) if v.quant is not None else t)
    return {o: float(((ref[o] - got[o]) ** 2).sum()) for o in outs}


def test_adaround_learns_rounding_on_the_grid_seeded_and_resumable(tmp_path):
    g = graph_of(31)
    calib = data(32, n=4)
    config = {"granularity": "per-tensor", "weight_method": "minmax"}
    nearest = npuforge.quantize(g, calib, config)
    opts = {**config, "adaround": True, "adaround_iters": 150, "adaround_cache": str(tmp_path / "cache")}
    learnt = npuforge.quantize(g, calib, opts)
    report = learnt.metadata["quantization"]["adaround"]
    assert report["layers"] == 4 and report["reused"] == 0 and 0 < report["flipped_share"] < 0.5
    for n in learnt.nodes:
        if "weight" in n.quant:  # float weights lie on the grid of their int8 constant
            w = learnt.values[n.inputs[1]]
            np.testing.assert_array_equal(w.quant.quantize(w.data), learnt.values[n.quant["weight"]].data)
    # the whole network tracks float better than with nearest rounding
    x = np.concatenate(data(33, n=2))
    ref = run(g, x)
    fq = lambda q: run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]  # noqa: E731
    assert sqnr(ref, fq(learnt)) > sqnr(ref, fq(nearest))
    # resumed from the cache: every layer reused, the same weights
    again = npuforge.quantize(g, calib, opts)
    assert again.metadata["quantization"]["adaround"]["reused"] == 4

    def constants(q):
        return [q.values[n.quant[k]].data for n in q.nodes for k in ("weight", "bias") if k in n.quant]

    assert len(constants(learnt)) == 8
    for a, b in zip(constants(again), constants(learnt)):  # the biases corrected alike
        np.testing.assert_array_equal(a, b)
    # seeded: without the cache the same rounding (and bias correction) is learnt again
    fresh = npuforge.quantize(g, calib, {**opts, "adaround_cache": ""})
    for a, b in zip(constants(fresh), constants(learnt)):
        np.testing.assert_array_equal(a, b)


def shift_left(q, feeds, compute) -> dict:
    """Per layer with a bias: |mean output shift| per channel against the float network (the
    layer-wise float side, float weights), in steps of the int32 bias."""
    from npuforge.ops.registry import get_op
    from npuforge.quant.bias_correction import output_shift
    from npuforge.quant.layerwise import run_layerwise, without_activation

    left = {}

    def measure(node, xs_f, xs_q, pre_f):
        if "bias" in node.quant:
            pre_q = get_op(node.op).forward(without_activation(node), xs_q)[0]
            left[node.name] = np.abs(output_shift(node, pre_q, pre_f)) / q.values[node.inputs[2]].quant.scale

    run_layerwise(q, feeds, compute, measure)
    return left


def test_adaround_corrects_each_bias_once_its_rounding_is_learnt():
    """By default AdaRound corrects a layer's bias right after learning its rounding, so the
    layers after it learn on corrected inputs: no shift is left but the int32 rounding, where
    AdaRound without it leaves shifts of many steps."""
    from npuforge.quant.adaround import adaround

    g = graph_of(51)
    calib = data(52, n=4)
    base = npuforge.quantize(g, calib, {"granularity": "per-tensor", "weight_method": "minmax"})
    compute = {n.name for n in base.nodes if "weight" in n.quant}
    feeds = [{base.inputs[0]: b} for b in calib]
    corrected, plain = copy.deepcopy(base), copy.deepcopy(base)
    assert adaround(corrected, feeds, compute, iterations=60)["biases_corrected"] == 4
    assert adaround(plain, feeds, compute, iterations=60, bias_correction=False)["biases_corrected"] == 0
    first = next(n for n in base.nodes if n.name in compute)  # same input: same rounding
    np.testing.assert_array_equal(corrected.values[first.quant["weight"]].data,
                                  plain.values[first.quant["weight"]].data)
    left, before = shift_left(corrected, feeds, compute), shift_left(plain, feeds, compute)
    assert len(left) == 4 and max(float(v.max()) for v in left.values()) < 1 + 1e-3
    assert max(float(v.max()) for v in before.values()) > 10
    for n in corrected.nodes:  # the float bias kept for later passes, the int32 one follows the corrected one
        if "bias" in n.quant:
            b = corrected.values[n.inputs[2]]
            assert not np.array_equal(b.float_data, b.data)
            np.testing.assert_array_equal(corrected.values[n.quant["bias"]].data, b.quant.quantize(b.data))
    x = np.concatenate(calib)
    ref = run(g, x)

    def shift(q):
        return float(np.abs((run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]] - ref).mean(axis=0)).mean())

    assert shift(corrected) < 0.5 * shift(plain)


def test_bias_correction_after_adaround_measures_against_the_float_weights():
    """AdaRound leaves its weights on the int8 grid; the bias correction that follows must
    still compare with the float network (the float weights), so a second pass over the
    same images finds only the int32 bias rounding left to correct (before, it compared
    with the rounded weights and found the weights' share of each shift)."""
    from npuforge.quant.layerwise import float_data, run_layerwise

    g = graph_of(41)
    calib = data(42, n=4)
    q = npuforge.quantize(g, calib, {"granularity": "per-tensor", "weight_method": "minmax", "adaround": True,
                                     "adaround_iters": 60, "bias_correction": True})
    compute = {n.name for n in q.nodes if "weight" in n.quant}
    feeds = [{q.inputs[0]: b} for b in calib]
    float_out = {}
    run_layerwise(q, feeds, compute, lambda node, xs_f, xs_q, pre_f: float_out.setdefault(node.name, pre_f))
    last = next(n for n in reversed(q.nodes) if n.name in compute)
    np.testing.assert_allclose(float_out[last.name].numpy(), run(g, np.concatenate(calib)), rtol=1e-4, atol=1e-5)
    for n in q.nodes:
        if n.name in compute:  # the grid weights and, beside them, the float ones
            w = q.values[n.inputs[1]]
            np.testing.assert_array_equal(w.quant.quantize(w.data), q.values[n.quant["weight"]].data)
            assert not np.array_equal(float_data(w), w.data)
    left = shift_left(q, feeds, compute)
    # what is left is the int32 rounding of the old and the new bias: under one step each channel
    assert len(left) == 4 and max(float(v.max()) for v in left.values()) < 1 + 1e-3


def test_bias_correction_averages_over_the_unclipped_outputs():
    """The shift is measured where the float output is in the activation's linear part: a
    bias change moves the output only there."""
    from npuforge.ir.graph import Node
    from npuforge.quant.bias_correction import output_shift

    node = Node("c", "Conv", ["x", "w"], ["y"], {"activation": "Relu", "activation_params": []})
    pre_f = torch.tensor([[[-1.0, 2.0, 3.0]], [[-2.0, 1.0, -3.0]]])  # 2 images, 1 channel, 3 positions
    pre_q = pre_f + torch.tensor([[[5.0, 0.1, 0.2]], [[5.0, 0.3, 5.0]]])  # large errors only where clipped
    np.testing.assert_allclose(output_shift(node, pre_q, pre_f, chunk=1), [0.2], rtol=1e-6)
    none = Node("c", "Conv", ["x", "w"], ["y"], {"activation": "", "activation_params": []})
    np.testing.assert_allclose(output_shift(none, pre_q, pre_f), [(15 + 0.6) / 6], rtol=1e-6)


class Upsampler(torch.nn.Module):
    """ConvTranspose and a MatMul with a constant weight: compute nodes with no fused activation."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(3, 6, 2, stride=2)
        self.w = torch.nn.Parameter(torch.randn(16, 5) * 0.3)

    def forward(self, x):
        return torch.relu(self.up(x)).flatten(2) @ self.w


def test_adaround_and_bias_correction_handle_conv_transpose_and_matmul():
    torch.manual_seed(5)
    g = optimize(npuforge.from_torch(Upsampler().eval(), torch.zeros(1, 3, 2, 2)))[0]
    assert {"ConvTranspose", "MatMul"} <= set(g.op_histogram())
    rng = np.random.default_rng(6)
    calib = [rng.standard_normal((8, 3, 2, 2)).astype(np.float32) for _ in range(3)]
    q = npuforge.quantize(g, calib, {"adaround": True, "adaround_iters": 20, "bias_correction": True})
    meta = q.metadata["quantization"]
    assert meta["adaround"]["layers"] == 2 and meta["bias_correction"]["corrected"] == 1  # the MatMul has no bias
    x = calib[0]
    assert sqnr(run(g, x), run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]) > 25


class _FixedBatchNet(torch.nn.Module):
    """A head that reshapes to [1, -1], as exported files with batch 1 often do."""

    def __init__(self, fixed: bool):
        super().__init__()
        self.conv, self.fc, self.fixed = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4 * 4 * 4, 5), fixed

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(y.reshape(1 if self.fixed else -1, 4 * 4 * 4))


def test_bias_correction_and_adaround_on_a_model_that_fixes_its_batch_at_1():
    """The layer-wise passes run each op on one image at a time where the model fixes its batch (they
    ran every image as one batch, which a Reshape to [1, -1] refuses): same result as the same model
    with a dynamic batch."""
    torch.manual_seed(0)
    dynamic = _FixedBatchNet(False).eval()
    fixed = _FixedBatchNet(True).eval()
    fixed.load_state_dict(dynamic.state_dict())
    graphs = [npuforge.from_torch(net, torch.zeros(1, 3, 6, 6), dynamic_batch=net is dynamic)
              for net in (dynamic, fixed)]
    assert [g.values[g.inputs[0]].shape[0] for g in graphs] == ["N", 1]
    calib = [np.random.default_rng(k).standard_normal((1, 3, 6, 6)).astype(np.float32) for k in range(5)]
    config = {"bias_correction": True, "adaround": True, "adaround_iters": 20}
    results = [npuforge.quantize(g, calib, config, log=lambda m: None) for g in graphs]
    assert results[1].metadata["quantization"]["bias_correction"]["corrected"] == 2
    for a, b in zip(*(sorted((n.name, v) for n in q.nodes for k, v in n.quant.items() if k in ("weight", "bias"))
                      for q in results)):
        np.testing.assert_array_equal(results[0].values[a[1]].data, results[1].values[b[1]].data)
