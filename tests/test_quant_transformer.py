"""The transformer path in int8: Softmax and LayerNormalization with exact integer
rules (checked against plain Python-integer references), GELU as a table, MatMul of
two activations, and a whole attention block quantized end to end."""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import npuforge
from npuforge.export import to_qdq_onnx
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.integer import IntegerSimulator


def _graph(module, example):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example, buf, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"])
    return npuforge.import_onnx(onnx.load_from_string(buf.getvalue()))


def _quantized(module, shape, seed=0, batches=3):
    torch.manual_seed(seed)
    graph = _graph(module, torch.zeros(*shape))
    rng = np.random.default_rng(seed)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(batches)]
    messages = []
    q = npuforge.quantize(graph, calib, log=messages.append)
    return graph, q, calib, messages


def _node(q, op):
    return next(n for n in q.nodes if n.op == op)


def _output_steps_off_fake(q, x) -> float:
    """The integer simulator's largest distance from fake-quant on the graph output, in output steps."""
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    integer = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
    return float(np.abs(integer - fake).max()) / float(q.values[q.outputs[0]].quant.scale)


def _codes(q, x, name):
    return IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x}, outputs=[name], dequantize=False)[name]


# -- Softmax -----------------------------------------------------------------------------------------

class SoftmaxNet(torch.nn.Module):
    def __init__(self, axis):
        super().__init__()
        self.fc = torch.nn.Linear(16, 24)
        self.axis = axis

    def forward(self, x):
        return torch.softmax(self.fc(x) * 2.0, self.axis)


def softmax_reference(q_in, table, r, m, zp, qmin, qmax, axis):
    """The documented rule in plain Python integers, element by element."""
    q = np.moveaxis(q_in.astype(object), axis, -1)
    out = np.empty(q.shape, dtype=np.int64)
    for idx in np.ndindex(q.shape[:-1]):
        row = [int(v) for v in q[idx]]
        top = max(row)
        e = [int(table[v - top + len(table) - 1]) for v in row]
        total = sum(e)
        out[idx] = [min(max((2 * ei * r + total * 2 ** m) // (2 * total * 2 ** m) + zp, qmin), qmax) for ei in e]
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_integer_rule_equals_its_reference_and_tracks_float(axis):
    graph, q, calib, messages = _quantized(SoftmaxNet(axis), (3, 5, 16))
    node = _node(q, "Softmax")
    assert q.values[node.outputs[0]].quant is not None and not any("kept in float" in m for m in messages)
    x = calib[0]
    q_in, q_out = _codes(q, x, node.inputs[0]), _codes(q, x, node.outputs[0])
    yp = q.values[node.outputs[0]].quant
    ref = softmax_reference(q_in, q.values[node.quant["exp"]].data, int(q.values[node.quant["multiplier"]].data),
                            int(q.values[node.quant["shift"]].data), int(yp.zero_point), yp.qmin, yp.qmax, axis)
    np.testing.assert_array_equal(q_out.astype(np.int64), ref)
    # against fake-quant (float softmax of the same dequantized input, rounded to the output grid)
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    integer = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(integer - fake).max() <= 1.01 * float(yp.scale)


def test_softmax_agrees_with_onnx_runtime_qlinearsoftmax_within_a_code():
    graph, q, calib, _ = _quantized(SoftmaxNet(-1), (3, 5, 16))
    node = _node(q, "Softmax")
    xp, yp = q.values[node.inputs[0]].quant, q.values[node.outputs[0]].quant
    x = calib[1]
    q_in, q_out = _codes(q, x, node.inputs[0]), _codes(q, x, node.outputs[0])
    consts = [helper.make_tensor(n, TensorProto.FLOAT, [], [float(p.scale)]) for n, p in (("xs", xp), ("ys", yp))]
    consts += [helper.make_tensor(n, TensorProto.UINT8, [], [int(p.zero_point)]) for n, p in (("xz", xp), ("yz", yp))]
    qnode = helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft", axis=-1,
                             opset=13)
    g = helper.make_graph([qnode], "s", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(q_in.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, list(q_in.shape))], consts)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": q_in.astype(np.uint8)})[0]
    diff = np.abs(theirs.astype(np.int64) - q_out.astype(np.int64))
    print(f"\nSoftmax codes vs ORT QLinearSoftmax: {100 * (diff > 0).mean():.2f}% differ, max {diff.max()}")
    assert diff.max() <= 1


# -- LayerNormalization -------------------------------------------------------------------------------

class NormNet(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc = torch.nn.Linear(16, d)
        self.norm = torch.nn.LayerNorm(d)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 2.0)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(self.fc(x) * 3.0 + 1.0)


def layernorm_reference(q_in, g, b, eps, shift, zp, qmin, qmax, zp_in=None):
    """The documented rule in plain Python integers over the last axis (``zp_in`` given:
    L2Normalize's, uncentred)."""
    n = q_in.shape[-1]
    p = 62 - n.bit_length()
    p -= p % 2
    out = np.empty(q_in.shape, np.int64)
    for idx in np.ndindex(q_in.shape[:-1]):
        row = [int(v) for v in q_in[idx]]
        s = sum(row)
        if zp_in is None:
            c = [n * v - s for v in row]
            d = n * sum(v * v for v in row) - s * s + eps
        else:
            c = [v - zp_in for v in row]
            d = max(sum(ci * ci for ci in c), eps)
        h = sum(d >= 1 << (21 + 2 * j) for j in range(1, 21))
        r = math.isqrt((1 << 60) // (d >> (2 * h)))
        down = 30 - p // 2
        out[idx] = [min(max(((((ci * r) >> (h + down)) * int(gi) + int(bi) + (1 << (shift - 1))) >> shift) + zp,
                            qmin), qmax) for ci, gi, bi in zip(c, g, b)]
    return out


def test_layernorm_integer_rule_equals_its_reference_and_tracks_float():
    graph, q, calib, messages = _quantized(NormNet(), (4, 6, 16))
    node = _node(q, "LayerNormalization")
    assert q.values[node.outputs[0]].quant is not None and not any("kept in float" in m for m in messages)
    x = calib[0]
    q_in, q_out = _codes(q, x, node.inputs[0]), _codes(q, x, node.outputs[0])
    yp = q.values[node.outputs[0]].quant
    data = {role: q.values[name].data for role, name in node.quant.items()}
    ref = layernorm_reference(q_in, data["scale"], data["bias"], int(data["epsilon"]), int(data["shift"]),
                              int(yp.zero_point), yp.qmin, yp.qmax)
    np.testing.assert_array_equal(q_out.astype(np.int64), ref)
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    integer = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(integer - fake).max() <= 1.01 * float(yp.scale)


def test_layernorm_output_sum_fits_float64_with_the_most_fractional_bits():
    """G carries the most fractional bits F (at most 24, here at least 12) that keep the last
    step's |u G + B + 2^(T-1)| below 2^53, where a float64 holds it exactly."""
    from npuforge.quant import layernorm_rule

    _, q, _, _ = _quantized(NormNet(), (4, 6, 16))
    node = _node(q, "LayerNormalization")
    data = {role: q.values[name].data for role, name in node.quant.items()}
    g, b, t = np.asarray(data["scale"]), np.asarray(data["bias"]), int(data["shift"])
    f = t - layernorm_rule._p_bits(32) // 2
    assert layernorm_rule.FLOAT64_MIN_F <= f <= layernorm_rule.MAX_F
    assert layernorm_rule.output_bound(layernorm_rule.u_max(32), g, b, t) < layernorm_rule.FLOAT64_SUMS
    if f < layernorm_rule.MAX_F:  # one more bit would pass 2^53
        s_y = float(q.values[node.outputs[0]].quant.scale)
        scale, bias = (np.asarray(q.values[name].data, np.float64) for name in node.inputs[1:3])
        more = [np.rint(v * 2.0 ** (e + 1) / s_y).astype(np.int64) for v, e in ((scale, f), (bias, t))]
        assert layernorm_rule.output_bound(layernorm_rule.u_max(32), *more, t + 1) >= layernorm_rule.FLOAT64_SUMS


class L2Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 40)

    def forward(self, x):
        return torch.nn.functional.normalize(self.fc(x) + 0.5, dim=-1) * 2.0


def test_l2_normalize_takes_the_integer_rule_uncentred():
    graph, q, calib, messages = _quantized(L2Net(), (4, 6, 16))
    node = _node(q, "L2Normalize")
    assert not any("kept in float" in m for m in messages) and "Div" not in {n.op for n in q.nodes}
    x = calib[0]
    q_in, q_out = _codes(q, x, node.inputs[0]), _codes(q, x, node.outputs[0])
    xp, yp = q.values[node.inputs[0]].quant, q.values[node.outputs[0]].quant
    data = {role: q.values[name].data for role, name in node.quant.items()}
    ref = layernorm_reference(q_in, np.broadcast_to(data["scale"], (40,)), np.broadcast_to(data["bias"], (40,)),
                              int(data["epsilon"]), int(data["shift"]), int(yp.zero_point), yp.qmin, yp.qmax,
                              zp_in=int(xp.zero_point))
    np.testing.assert_array_equal(q_out.astype(np.int64), ref)
    fake = run_fake_quant(q, {q.inputs[0]: x}, outputs=[node.outputs[0]])[node.outputs[0]]
    integer = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x}, outputs=[node.outputs[0]])[node.outputs[0]]
    assert np.abs(integer - fake).max() <= 1.01 * float(yp.scale)


class InstanceNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.norm = torch.nn.InstanceNorm2d(6, affine=True)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 2.0)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(self.conv(x))


def test_instance_norm_takes_the_same_integer_rule_per_channel():
    graph, q, calib, messages = _quantized(InstanceNet(), (2, 3, 5, 7))
    node = _node(q, "InstanceNormalization")
    assert not any("kept in float" in m for m in messages)
    x = calib[0]
    q_in, q_out = _codes(q, x, node.inputs[0]), _codes(q, x, node.outputs[0])
    yp = q.values[node.outputs[0]].quant
    data = {role: q.values[name].data for role, name in node.quant.items()}
    assert data["scale"].shape == (6, 1, 1)
    n, c = q_in.shape[:2]
    flat = q_in.reshape(n, c, -1)  # each (sample, channel) normalized over its 35 positions
    ref = np.stack([layernorm_reference(flat[:, k], np.repeat(data["scale"][k].reshape(-1), 35),
                                        np.repeat(data["bias"][k].reshape(-1), 35), int(data["epsilon"]),
                                        int(data["shift"]), int(yp.zero_point), yp.qmin, yp.qmax) for k in range(c)], 1)
    np.testing.assert_array_equal(q_out.astype(np.int64).reshape(n, c, -1), ref)
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    integer = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(integer - fake).max() <= 1.01 * float(yp.scale)


class WideInstanceNet(torch.nn.Module):
    """InstanceNorm over 128 x 128 positions of a widely spread map (N = 16384)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)
        self.norm = torch.nn.InstanceNorm2d(2, affine=True)

    def forward(self, x):
        return self.norm(self.conv(x) * 4.0)


def test_large_slices_keep_the_normalization_precise():
    """Without the per-slice shift of the variance, the reciprocal square root of a
    16384-element slice kept a handful of bits and the outputs strayed by several codes."""
    graph, q, calib, _ = _quantized(WideInstanceNet(), (2, 3, 128, 128), batches=2)
    node = _node(q, "InstanceNormalization")
    assert q.values[node.outputs[0]].quant is not None
    assert _output_steps_off_fake(q, calib[0]) <= 1.01


def test_slices_past_the_old_int64_bound_are_quantized():
    """A 200 x 200 InstanceNorm (N = 40,000 8-bit codes) was kept in float while the rule
    summed squares of N times the centred code (N^3 * 255^2 past 2^61 from N = 32,768)."""
    graph, q, calib, messages = _quantized(WideInstanceNet(), (1, 3, 200, 200), batches=1)
    assert not any("kept in float" in m for m in messages)
    assert _output_steps_off_fake(q, calib[0]) <= 1.01


def test_int16_slices_past_the_int64_bound_are_refused_by_name():
    torch.manual_seed(0)
    graph = _graph(WideInstanceNet(), torch.zeros(1, 3, 220, 220))  # N = 48,400 int16 codes: N * 32768 > 2^30.5
    norm = next(n for n in graph.nodes if n.op == "InstanceNormalization")
    calib = [np.random.default_rng(0).standard_normal((1, 3, 220, 220)).astype(np.float32)]
    with pytest.raises(npuforge.NpuforgeError, match=r"InstanceNormalization\): 48400 input codes .* keep it in float"):
        npuforge.quantize(graph, calib, {"int16": [norm.inputs[0]]}, log=lambda m: None)


class ClassTokenNet(torch.nn.Module):
    """A ViT's first steps: a near-zero class token concatenated before the patch tokens,
    a position embedding, a LayerNorm."""

    def __init__(self, d=32):
        super().__init__()
        self.embed = torch.nn.Linear(16, d)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, d) * 1e-6)
        self.pos = torch.nn.Parameter(torch.randn(1, 9, d) * 0.02)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.embed(x) * 3.0], dim=1)
        return self.norm(tokens + self.pos)


def test_a_normalization_with_a_narrow_slice_gets_an_int16_input():
    torch.manual_seed(0)
    graph = _graph(ClassTokenNet(), torch.zeros(2, 8, 16))
    rng = np.random.default_rng(0)
    calib = [rng.standard_normal((2, 8, 16)).astype(np.float32) for _ in range(3)]
    x = calib[0]
    ref = graph.run({graph.inputs[0]: x})[graph.outputs[0]][:, 0]  # the class token's row
    errors = {}
    for codes in (0.0, 8.0):
        messages = []
        q = npuforge.quantize(graph, calib, {"norm_spread_codes": codes}, log=messages.append)
        node = _node(q, "LayerNormalization")
        narrow = [m for m in messages if "narrowest input slice" in m]
        dtype = q.values[node.inputs[0]].quant.dtype
        recorded = q.metadata["quantization"]["int16_norms"]
        if codes:
            assert len(narrow) == 1 and f"'{node.name}'" in narrow[0] and dtype == "int16"
            assert recorded[0]["node"] == node.name and recorded[0]["codes"] < 1
        else:
            assert not narrow and dtype == "uint8" and recorded == []
        fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
        integer = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
        assert np.abs(integer - fake).max() <= 1.01 * float(q.values[q.outputs[0]].quant.scale)
        errors[codes] = float(np.abs(integer[:, 0] - ref).max())
    print(f"\nclass-token row, max |integer - float|: 8-bit input {errors[0.0]:.3f}, int16 input {errors[8.0]:.3f}")
    assert errors[8.0] < 0.25 * errors[0.0]


def test_slice_spread_keeps_the_narrowest_non_constant_slice():
    from npuforge.quant.norm_spread import SliceSpread

    x = torch.tensor([[[1.0, 3.0], [5.0, 5.0], [0.0, 0.5]]])  # rows: std 1, 0 (constant), 0.25
    centred, rms = SliceSpread((2,), True), SliceSpread((2,), False)
    for tracker in (centred, rms):
        tracker.update(x)
        tracker.update(x * 4)
    assert centred.smallest == pytest.approx(0.25) and rms.smallest == pytest.approx(math.sqrt(0.125))


def test_isqrt_is_exact_near_squares():
    from npuforge.quant.layernorm_rule import isqrt

    roots = np.array([0, 1, 2, 3, 2 ** 20 - 1, 2 ** 26 + 1, 2 ** 30, 2 ** 31 - 1], np.int64)  # a below 2^62
    for delta in (-1, 0, 1):
        a = np.maximum(roots * roots + delta, 0)
        got = isqrt(torch.from_numpy(a)).numpy()
        np.testing.assert_array_equal(got, [math.isqrt(int(v)) for v in a])


# -- a whole attention block ------------------------------------------------------------------------

class Block(torch.nn.Module):
    """Pre-norm transformer block: multi-head self-attention and a GELU MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.dh), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def _cosine(a, b):
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_attention_block_quantizes_with_nothing_in_float():
    graph, q, calib, messages = _quantized(Block(), (2, 10, 32), batches=4)
    assert not [m for m in messages if "kept in float" in m], messages
    hist = q.op_histogram()
    assert {"Softmax", "LayerNormalization", "Gelu", "MatMul"} <= set(hist) and "Erf" not in hist and "Div" not in hist
    kinds = {n.op: npuforge.ops.registry.get_op(n.op).quant_kind(n, q) for n in q.nodes}
    assert kinds["Softmax"] == "softmax" and kinds["LayerNormalization"] == "layernorm" and kinds["Gelu"] == "lut"
    assert all(q.values[o].quant is not None for n in q.nodes for o in n.outputs
               if q.values[o].dtype == "float32")
    x = np.random.default_rng(9).standard_normal((2, 10, 32)).astype(np.float32)
    options = ort.SessionOptions()  # the QDQ file's float arithmetic: ORT's fused int8 kernels saturate
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # on x86 without VNNI
    sess = ort.InferenceSession(to_qdq_onnx(q).SerializeToString(), options, providers=["CPUExecutionProvider"])
    # the block's own contribution y - x (the residual stream alone would make any cosine look good)
    ref = graph.run({"x": x})["y"] - x
    fake = run_fake_quant(q, {"x": x})["y"] - x
    integer = IntegerSimulator(q, "fixedpoint").run({"x": x})["y"] - x
    qdq = sess.run(None, {"x": x})[0] - x
    print(f"\nattention block, y - x cosine vs float: fake-quant {_cosine(fake, ref):.4f}, integer "
          f"{_cosine(integer, ref):.4f}, ORT QDQ {_cosine(qdq, ref):.4f}; integer vs fake-quant {_cosine(integer, fake):.5f}")
    assert min(_cosine(fake, ref), _cosine(integer, ref), _cosine(qdq, ref)) >= 0.99
    assert _cosine(integer, fake) >= 0.999
    sim = IntegerSimulator(q, "fixedpoint")
    assert all(sim._kind(n) is not None for n in q.nodes)  # every node runs in integers


class _CausalAttention(torch.nn.Module):
    """The attention probabilities of a decoder: scores plus a constant causal mask, then Softmax."""

    def __init__(self, dropped: float):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("mask", torch.triu(torch.full((6, 6), dropped), diagonal=1))

    def forward(self, x):
        q = self.proj(x)
        return torch.softmax(q @ x.transpose(1, 2) * 0.35 + self.mask, dim=-1)


@pytest.mark.parametrize("dropped", [-math.inf, float(np.finfo(np.float32).min), -1e4])
def test_an_additive_attention_mask_gives_exact_zeros_and_keeps_the_scores_range(dropped):
    """-inf has no code and finfo.min would stretch the scores' range over 10^38: the calibration sees
    the kept positions only, the mask becomes a finite value below that range, and the integer Softmax
    gives the dropped positions 0, as float does."""
    graph, q, calib, _ = _quantized(_CausalAttention(dropped), (1, 6, 8))
    x = calib[0]  # inside the calibrated ranges: what differs is rounding
    want = graph.run({"x": x})["y"]
    got = IntegerSimulator(q).run({"x": x})["y"]
    upper = np.triu(np.ones((6, 6), bool), 1)[None]
    assert np.all(got[upper] == 0)
    assert np.abs(got - want).max() < 0.03
    masked = next(n for n in q.nodes if n.op == "Add" and n.outputs[0] == q.nodes[-1].inputs[0])
    assert all(q.values[i].quant is not None for i in masked.inputs)  # the mask has codes
