"""Quantization: parameter math (property tests), observers, config, the quantizer's
structure on a small network, QDQ export against ONNX Runtime, and bad inputs."""

import filecmp
import math

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings, strategies as st

import npuforge
from npuforge.errors import NpuforgeError
from npuforge.export import to_qdq_onnx
from npuforge.quant.config import QuantConfig
from npuforge.quant.observers import HistogramObserver, make_observer
from npuforge.quant.params import QParams, from_range, to_symmetric
from npuforge.quant.requant import FOLD_MAX_BITS, multiplier_value, quantize_multiplier, requant_multiplier
from npuforge.sim.fake_quant import run_fake_quant

# -- parameter math -------------------------------------------------------------------

ranges = st.tuples(st.floats(-100, 0, allow_nan=False), st.floats(0, 100, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(r=ranges, dtype=st.sampled_from(["uint8", "int8", "int16"]), symmetric=st.booleans())
def test_range_params_keep_zero_exact_and_cover_the_range(r, dtype, symmetric):
    lo, hi = r
    p = from_range(lo, hi, dtype, symmetric)
    assert p.qmin <= int(p.zero_point) <= p.qmax
    assert p.dequantize(np.array(p.zero_point))[()] == 0.0
    xs = np.array([lo, hi, 0.0], np.float32)
    err = np.abs(p.dequantize(p.quantize(xs)) - xs)
    assert (err <= p.scale * 0.5 + 1e-6 * max(1.0, abs(lo), hi) + 1e-30).all()


@settings(max_examples=100, deadline=None)
@given(r=ranges, dtype=st.sampled_from(["uint8", "int8"]))
def test_quantize_round_trips_codes_and_saturates(r, dtype):
    p = from_range(*r, dtype, symmetric=False)
    codes = np.arange(p.qmin, p.qmax + 1)
    np.testing.assert_array_equal(p.quantize(p.dequantize(codes)), codes)
    big = np.array([1e9, -1e9], np.float32)
    np.testing.assert_array_equal(p.quantize(big), [p.qmax, p.qmin])
    torch_fq = p.fake_quant(torch.from_numpy(p.dequantize(codes)))
    np.testing.assert_array_equal(torch_fq.numpy(), p.dequantize(codes))


@settings(max_examples=100, deadline=None)
@given(r=ranges)
def test_to_symmetric_covers_the_asymmetric_range(r):
    p = from_range(*r, "int8", symmetric=False)
    s = to_symmetric(p)
    assert int(s.zero_point) == 0
    lo, hi = p.dequantize(np.array([p.qmin, p.qmax]))
    assert s.dequantize(np.array(127)) >= max(-lo, hi) * (1 - 1e-6)


def test_rounding_is_half_to_even():
    p = QParams("int8", np.float32(1.0), np.int32(0))
    np.testing.assert_array_equal(p.quantize(np.array([0.5, 1.5, 2.5, -0.5, -1.5])), [0, 2, 2, 0, -2])
    np.testing.assert_array_equal(p.fake_quant(torch.tensor([0.5, 1.5, 2.5])).numpy(), [0, 2, 2])


@settings(max_examples=300, deadline=None)
@given(m=st.floats(1e-9, 1e4, allow_nan=False))
def test_requant_multiplier_relative_error_below_2_pow_31(m):
    mult, shift = quantize_multiplier(np.array([m]))
    assert 2**30 <= int(mult[0]) < 2**31
    assert abs(multiplier_value(mult, shift)[0] - m) <= m * 2.0**-31


@settings(max_examples=300, deadline=None)
@given(m=st.floats(1e-9, 1e4, allow_nan=False))
def test_stored_multiplier_folds_short_right_shifts(m):
    """The quantizer's form: right shifts of 1..10 bits folded into the multiplier (shift 0,
    one rounding, >= 21 bits left); other multipliers as TFLite normalizes them."""
    norm_mult, norm_shift = quantize_multiplier(np.array([m]))
    mult, shift = requant_multiplier(np.array([m]))
    tm, ts = requant_multiplier(np.array([m]), tflite=True)
    assert (int(tm[0]), int(ts[0])) == (int(norm_mult[0]), int(norm_shift[0]))
    if -FOLD_MAX_BITS <= int(norm_shift[0]) < 0:
        assert int(shift[0]) == 0 and 2**20 <= int(mult[0]) <= 2**30
        assert abs(multiplier_value(mult, shift)[0] - m) <= m * 2.0**-21
    else:
        assert (int(mult[0]), int(shift[0])) == (int(norm_mult[0]), int(norm_shift[0]))


def test_folded_multiplier_rounds_once():
    """With the shift folded in, gemmlowp's fixed-point rule is single rounding: its result
    equals round-half-up of acc * m wherever the two roundings of the TFLite form differ."""
    import torch

    from npuforge.sim.int_ops import requantize_fixedpoint

    m = 0.0123  # a right shift of 6 bits in TFLite's form
    acc = torch.arange(-20000, 20000)
    exact = np.floor(acc.numpy() * m + 0.5)
    mult, shift = requant_multiplier(np.array([m]))
    folded = requantize_fixedpoint(acc, int(mult[0]), int(shift[0])).numpy()
    tm, ts = requant_multiplier(np.array([m]), tflite=True)
    twice = requantize_fixedpoint(acc, int(tm[0]), int(ts[0])).numpy()
    assert (folded != exact).mean() < 1e-4
    assert (twice != exact).mean() > 0.005  # about 2^-(6+1) of the values


def test_requant_multiplier_zero_and_errors():
    mult, shift = quantize_multiplier(np.array([0.0, 0.5]))
    assert mult[0] == 0 and mult[1] == 2**30 and shift[1] == 0
    for bad in (-1.0, -np.inf, np.nan):  # a user's model (a -inf bias), not a bug: one line, exit 2
        with pytest.raises(NpuforgeError, match="multiplier is"):
            quantize_multiplier(np.array([0.5, bad]))


# -- observers -----------------------------------------------------------------------

def test_minmax_and_mean_observers():
    mm, mean = make_observer("minmax"), make_observer("mean")
    for lo, hi in ((-1.0, 2.0), (-3.0, 1.0)):
        t = torch.tensor([lo, 0.5, hi])
        mm.update(t)
        mean.update(t)
    assert mm.range(255) == (-3.0, 2.0)
    assert mean.range(255) == (-2.0, 1.5)


def test_histogram_grows_without_losing_counts():
    obs = HistogramObserver("percentile", bins=256)
    obs.update(torch.linspace(-1, 1, 1000))
    obs.update(torch.linspace(-10, 10, 1000))
    assert obs.hist.sum() == 2000 and obs.bound >= 10
    assert obs.range(255) == pytest.approx((-10, 10), rel=0.05)


def _batches(seed: int) -> list:
    """Batches whose ranges grow by small and by huge factors, with exact zeros, powers of two and tiny values."""
    rng = np.random.default_rng(seed)
    out = [torch.zeros(50)]
    for scale in rng.choice([1e-9, 0.03, 0.5, 1.0, 4.0, 7.9, 1e3, 3e9], size=7):
        x = torch.from_numpy((rng.standard_normal(400) * scale).astype(np.float32))
        out.append(torch.cat([x, torch.tensor([float(scale), -2.0 ** int(rng.integers(-4, 4))])]))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("method", ["minmax", "mean", "percentile", "kl", "mse"])
def test_observers_merged_from_shards_equal_one_observer_exactly(method, seed):
    """What torchrun's sharded calibration relies on: every split of the batches into contiguous
    shards, observed apart and merged in order, gives the same statistics bit for bit."""
    batches = _batches(seed)
    whole = make_observer(method, bins=256)
    for b in batches:
        whole.update(b)
    for cut in (1, 3, len(batches) - 1):
        shards = [make_observer(method, bins=256) for _ in range(2)]
        for i, b in enumerate(batches):
            shards[i >= cut].update(b)
        shards[0].merge(shards[1])
        assert shards[0].range(255) == whole.range(255)
        if method not in ("minmax", "mean"):
            assert shards[0].bound == whole.bound and np.array_equal(shards[0].hist, whole.hist)


def test_histogram_bins_do_not_depend_on_the_range_a_value_was_first_binned_at():
    x = torch.from_numpy(np.random.default_rng(1).standard_normal(5000).astype(np.float32))
    late = HistogramObserver("percentile", bins=64)
    late.update(torch.tensor([0.01]))
    late.update(x)  # binned at the range x needs
    early = HistogramObserver("percentile", bins=64)
    early.update(x)
    early.update(x[:1] * 0 + 1e6)  # 2^20 wider: x's bins merged into the centre
    direct = HistogramObserver("percentile", bins=64)
    direct.update(x[:1] * 0 + 1e6)
    direct.update(x)
    assert early.bound == direct.bound == 2.0 ** 20
    assert np.array_equal(early.hist, direct.hist)
    assert late.bound == 2.0 ** math.frexp(float(x.abs().max()))[1] and late.hist.sum() == 5001


@pytest.mark.parametrize("method", ["percentile", "kl"])
def test_histogram_methods_clip_outliers(method):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(200000).clamp(min=0), torch.tensor([80.0])])  # ReLU-like with one outlier
    obs = make_observer(method)
    obs.update(x)
    lo, hi = obs.range(255)
    assert lo == 0.0 and 2.0 < hi < 40.0


def test_mse_clips_a_heavy_tail_but_keeps_a_lone_outlier():
    torch.manual_seed(0)
    laplace = torch.distributions.Laplace(0.0, 1.0).sample((200000,))
    obs = make_observer("mse")
    obs.update(laplace)
    lo, hi = obs.range(255)
    assert 0.3 * laplace.max() < hi < 0.9 * laplace.max() and 0.3 * -laplace.min() < -lo < 0.9 * -laplace.min()
    # one far point costs more clipped than the rounding it saves: MSE keeps most of the range
    obs = make_observer("mse")
    obs.update(torch.cat([torch.randn(20000).clamp(min=0), torch.tensor([80.0])]))
    assert obs.range(255)[1] > 60


def test_nan_in_data_is_reported():
    obs = make_observer("minmax")
    with pytest.raises(FloatingPointError):
        obs.update(torch.tensor([0.0, float("nan")]))


# -- config --------------------------------------------------------------------------

def test_config_rejects_unknown_keys_and_misspelt_values():
    with pytest.raises(NpuforgeError, match="unknown quantization option 'granularty'; did you mean 'granularity'"):
        QuantConfig.from_dict({"granularty": "per-tensor"})
    with pytest.raises(NpuforgeError, match="method='minmx' is not one of .*did you mean 'minmax'"):
        QuantConfig(method="minmx")
    assert QuantConfig(granularity="per-tensor").resolved_weight_method == "mse"


# -- the quantizer on a small network ------------------------------------------------------

class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c3 = torch.nn.Conv2d(16, 6, 1)
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x):
        a = torch.relu(self.bn(self.c1(x)))
        b = torch.sigmoid(self.c2(a)) * 2.0
        c = torch.cat([a, b], 1)
        c = torch.nn.functional.max_pool2d(c, 2)
        d = torch.nn.functional.hardswish(self.c3(c)) + 0.5
        return self.fc(d.mean((2, 3)))


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    m = Small().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2)
    graph = npuforge.from_torch(m, torch.zeros(1, 3, 16, 16))
    rng = np.random.default_rng(1)
    calib = [rng.standard_normal((8, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    return m, graph, calib


def test_quantized_small_network_structure(small):
    _, graph, calib = small
    q = npuforge.quantize(graph, calib)
    ops = q.op_histogram()
    assert "BatchNormalization" not in ops  # the optimizer ran first
    by_op = {n.op: n for n in q.nodes}
    # concat inputs and output share one set of parameters; max-pool passes them through
    concat = by_op["Concat"]
    shared = [q.values[v].quant for v in concat.inputs + concat.outputs]
    assert all(p.same_as(shared[0]) for p in shared)
    pool = by_op["MaxPool"]
    assert q.values[pool.inputs[0]].quant.same_as(q.values[pool.outputs[0]].quant)
    # integers are decided once and stored
    conv = next(n for n in q.nodes if n.op == "Conv" and n.attrs["group"] == 8)
    assert set(conv.quant) == {"weight", "bias", "multiplier", "shift"}
    assert q.values[conv.quant["weight"]].dtype == "int8" and q.values[conv.quant["bias"]].dtype == "int32"
    assert q.values[conv.quant["multiplier"]].shape == (8,)
    assert q.values[by_op["Sigmoid"].quant["lut"]].shape == (256,)
    assert "lut" in by_op["HardSwish"].quant
    assert {"multiplier0", "shift0", "multiplier1", "shift1"} <= set(by_op["Add"].quant)


def test_fake_quant_tracks_float(small):
    _, graph, calib = small
    x = calib[0]
    ref = graph.run({graph.inputs[0]: x})[graph.outputs[0]]
    for gran in ("per-channel", "per-tensor"):
        q = npuforge.quantize(graph, calib, {"granularity": gran})
        out = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
        sqnr = 10 * np.log10((ref ** 2).sum() / ((ref - out) ** 2).sum())
        assert sqnr > 25, f"{gran}: SQNR {sqnr:.1f} dB"


def test_fake_quant_in_float64_is_the_same_program_whatever_the_batch(small):
    _, graph, calib = small
    q = npuforge.quantize(graph, calib, {"granularity": "per-tensor"})
    x, out = calib[0], q.outputs[0]
    wide = run_fake_quant(q, {q.inputs[0]: x}, precision="float64")[out]
    one_by_one = np.concatenate([run_fake_quant(q, {q.inputs[0]: x[i:i + 1]}, precision="float64")[out]
                                 for i in range(len(x))])
    assert wide.dtype == np.float32 and np.array_equal(wide, one_by_one)
    step = float(q.values[out].quant.scale)
    assert np.abs(wide - run_fake_quant(q, {q.inputs[0]: x})[out]).max() <= 1.01 * step
    with pytest.raises(ValueError, match="precision 'float16'"):
        run_fake_quant(q, {q.inputs[0]: x}, precision="float16")


def test_fake_quant_in_float64_quantizes_the_input_as_the_integer_program_does(small):
    """Float32 pixels at half-steps of the input grid: the float32 division (QuantizeLinear,
    the integer simulator's input) and a float64 one round some of them to other codes; the
    float64 executor takes the float32 codes."""
    _, graph, calib = small
    q = npuforge.quantize(graph, calib, {"granularity": "per-tensor"})
    name = q.inputs[0]
    p = q.values[name].quant
    s, zp = np.float32(p.scale), int(p.zero_point)
    k = np.arange(calib[0].size) % (p.qmax - p.qmin) + p.qmin - zp  # every code of the grid
    x = ((k + 0.5).astype(np.float32) * s).astype(np.float32).reshape(calib[0].shape)
    assert not np.array_equal(np.rint(x / s), np.rint(x.astype(np.float64) / np.float64(s)))  # the ties part
    wide = run_fake_quant(q, {name: x}, outputs=[name], precision="float64")[name]
    assert np.array_equal(wide, p.dequantize(p.quantize(x)))


def test_quantized_ir_round_trip_and_qdq_in_ort(small, tmp_path):
    _, graph, calib = small
    q = npuforge.quantize(graph, calib, {"method": "percentile"})
    npuforge.save(q, tmp_path / "a" / "q.nfir")
    q2 = npuforge.load(tmp_path / "a" / "q.nfir")
    npuforge.save(q2, tmp_path / "b" / "q.nfir")
    assert filecmp.cmp(tmp_path / "a" / "q.nfir", tmp_path / "b" / "q.nfir", shallow=False)
    x = calib[1]
    fq = run_fake_quant(q2, {q2.inputs[0]: x})[q2.outputs[0]]
    np.testing.assert_array_equal(fq, run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]])
    # ORT running the QDQ graph without its integer fusions computes the fake-quant numbers
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(to_qdq_onnx(q2).SerializeToString(), options, providers=["CPUExecutionProvider"])
    out = sess.run(None, {q2.inputs[0]: x})[0]
    step = float(q2.values[q2.outputs[0]].quant.scale)
    assert np.abs(out - fq).max() <= 2 * step


@pytest.mark.parametrize("include_pad", [False, True])
def test_qdq_average_pool_runs_in_ort_with_its_fusions(include_pad):
    """ORT fuses DQ -> AveragePool -> Q into QLinearAveragePool, which refuses a
    `dilations` attribute; the export leaves the all-ones default out."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(),
                            torch.nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=include_pad)).eval()
    graph = npuforge.from_torch(m, torch.zeros(1, 3, 12, 12))
    calib = [np.random.default_rng(2).standard_normal((4, 3, 12, 12)).astype(np.float32)]
    q = npuforge.quantize(graph, calib)
    model = to_qdq_onnx(q)
    pool = next(n for n in model.graph.node if n.op_type == "AveragePool")
    assert "dilations" not in {a.name for a in pool.attribute}
    outs = {}
    for level in ("ORT_ENABLE_ALL", "ORT_DISABLE_ALL"):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        outs[level] = sess.run(None, {q.inputs[0]: calib[0]})[0]
    fq = run_fake_quant(q, {q.inputs[0]: calib[0]})[q.outputs[0]]
    # with its fusions ONNX Runtime runs (the point); its fused int8 convolution saturates 16-bit pair
    # sums on x86 without VNNI, so the numbers are compared where they are defined: the QDQ file's own
    # float arithmetic (fusions off), one step of rounding from fake-quant at most
    assert outs["ORT_ENABLE_ALL"].shape == fq.shape and np.isfinite(outs["ORT_ENABLE_ALL"]).all()
    assert np.abs(outs["ORT_DISABLE_ALL"] - fq).max() <= 1.01 * float(q.values[q.outputs[0]].quant.scale)


class SharedZeros(torch.nn.Module):
    """Zero biases of a Conv and a Linear: merged into one constant, it is the Conv's
    int32 bias and the Linear's Add operand at once."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(8, 8, 1), torch.nn.Linear(8, 8)
        torch.nn.init.zeros_(self.conv.bias)
        torch.nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        return self.fc(self.conv(x).permute(0, 2, 3, 1))  # Linear on 4-D: MatMul + Add(bias)


def test_a_constant_read_in_two_roles_gets_a_copy_per_reader():
    from npuforge.sim.integer import IntegerSimulator

    torch.manual_seed(0)
    from npuforge.passes import optimize

    graph = npuforge.from_torch(SharedZeros().eval(), torch.zeros(2, 8, 6, 6))
    opt = optimize(graph)[0]  # cse merges equal constants, as the exporter sometimes does
    conv, add = (next(n for n in opt.nodes if n.op == op) for op in ("Conv", "Add"))
    assert conv.inputs[2] in add.inputs  # one constant, two parts
    x = np.random.default_rng(0).standard_normal((2, 8, 6, 6)).astype(np.float32)
    q = npuforge.quantize(graph, [x])
    qconv, qadd = (next(n for n in q.nodes if n.op == op) for op in ("Conv", "Add"))
    assert qconv.inputs[2] not in qadd.inputs
    assert q.values[qconv.inputs[2]].quant.dtype == "int32" and q.values[qconv.inputs[2]].quant.axis == 0
    got = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(got - fake).max() <= 1.01 * float(q.values[q.outputs[0]].quant.scale)


def test_a_bias_beyond_int32_widens_the_weight_scale_with_a_warning():
    """A tiny input range makes s_x * s_w tiny: the bias code would saturate int32 and
    the output lose its bias silently (a detector head's last Conv, a classifier's Gemm)."""
    from npuforge.sim.integer import IntegerSimulator

    torch.manual_seed(0)
    m = torch.nn.Conv2d(3, 4, 1)
    with torch.no_grad():
        m.bias.fill_(5.0)
    graph = npuforge.from_torch(m.eval(), torch.zeros(1, 3, 4, 4))
    x = (np.random.default_rng(0).standard_normal((2, 3, 4, 4)) * 1e-6).astype(np.float32)
    messages = []
    q = npuforge.quantize(graph, [x], log=messages.append)
    warned = [msg for msg in messages if "does not fit int32" in msg]
    assert len(warned) == 1 and "4 output channel(s) in 1 node(s)" in warned[0] and "tiny input range" in warned[0]
    conv = q.nodes[0]
    assert np.abs(q.values[conv.quant["bias"]].data.astype(np.int64)).max() <= 2**30
    ref = graph.run({graph.inputs[0]: x})[graph.outputs[0]]
    step = float(q.values[q.outputs[0]].quant.scale)
    for out in (run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]],
                IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]):
        assert np.abs(out - ref).max() <= step  # the bias (5) is kept, to an output step


def test_op_without_rule_is_kept_float_with_warning_or_error_when_strict():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LogSoftmax(dim=1))
    graph = npuforge.from_torch(m, torch.zeros(1, 3, 6, 6))
    calib = [np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32)]
    messages = []
    q = npuforge.quantize(graph, calib, log=messages.append)
    assert any("(LogSoftmax) kept in float: no quantization rule" in m for m in messages)
    assert q.values[q.outputs[0]].quant is None
    with pytest.raises(NpuforgeError, match=r"\(LogSoftmax\) has no quantization rule \(strict mode\)"):
        npuforge.quantize(graph, calib, {"strict": True})
    for option in ("keep_float", "per_channel"):
        with pytest.raises(NpuforgeError, match=f"{option} names unknown node"):
            npuforge.quantize(graph, calib, {option: ["no-such-node"]})


def test_nan_activation_names_the_value():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    graph = npuforge.from_torch(m, torch.zeros(1, 3, 6, 6))
    bad = np.zeros((2, 3, 6, 6), np.float32)
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(NpuforgeError, match="calibration batch 0: value '.*' .* holds NaN or Inf"):
        npuforge.quantize(graph, [bad])


def test_no_calibration_data():
    graph = npuforge.from_torch(torch.nn.Conv2d(3, 4, 3), torch.zeros(1, 3, 6, 6))
    with pytest.raises(NpuforgeError, match="calibration got no data"):
        npuforge.quantize(graph, [])


def test_checker_validates_quantization_annotations(small):
    _, graph, calib = small
    q = npuforge.quantize(graph, calib)
    conv = next(n for n in q.nodes if n.op == "Conv")
    conv.quant["weight"] = "nowhere"
    w = q.values[conv.inputs[1]]
    w.quant = QParams("int8", np.ones(3, np.float32), np.zeros(3, np.int32), axis=0)
    problems = q.problems()
    assert any("quantization integer 'weight' names 'nowhere'" in p for p in problems)
    assert any(f"value '{w.name}': per-channel parameters on axis 0 do not fit" in p for p in problems)
