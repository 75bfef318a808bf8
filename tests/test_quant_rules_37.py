"""Issue 37's quantization rules: PRelu (an int8 slope, two requantizations), Max / Min of
activations and Clip with computed bounds (each operand requantized to the output grid), and
NaN / infinity in fake-quant or the integer simulator as an error naming the node.

Each rule is checked node by node (the integer simulator's codes against the float op on its
own input codes, rounded once to the output grid: what fake-quant computes there), end to end
(integer simulator vs fake-quant vs float), and in ONNX Runtime (the QDQ file vs fake-quant).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

import npuforge
from npuforge.errors import NpuforgeError, UnsupportedError
from npuforge.export import to_qdq_onnx
from npuforge.ops.registry import get_op
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.integer import IntegerSimulator

ROUNDINGS = ("fixedpoint", "single", "onnx")


class PReluNet(nn.Module):
    """Per-channel slopes (negative, above 1, zero) and one shared slope."""

    def __init__(self):
        super().__init__()
        self.conv, self.act, self.shared = nn.Conv2d(3, 6, 3, padding=1), nn.PReLU(6), nn.PReLU()
        with torch.no_grad():
            self.act.weight.copy_(torch.tensor([0.25, -0.5, 1.5, 0.0, 0.01, 0.9]))

    def forward(self, x):
        return self.shared(self.act(self.conv(x)) - 0.2)


class MaxMinNet(nn.Module):
    """Max and Min of two activations on different grids, and Max with a per-channel constant."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
        self.register_buffer("floor", torch.tensor([-0.5, 0.0, 0.3, -2.0]).reshape(4, 1, 1))

    def forward(self, x):
        a, b = self.a(x), self.b(x) * 3
        return torch.cat([torch.maximum(a, b), torch.minimum(a, b), torch.maximum(a, self.floor)], 1)


class DynamicRangeFloor(nn.Module):
    """An audio front end's log-power in dB with an 80 dB floor below its peak: Clip(x, ReduceMax(x) - 80)."""

    def forward(self, x):
        db = 10 * torch.log10(x * x + 1e-10)
        return torch.clamp(db, min=db.max() - 80.0)


def _data(shape, seed, n=3):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _quantized(module, shape, config=None, seed=0, quiet=0):
    torch.manual_seed(0)
    graph = npuforge.from_torch(module.eval(), torch.zeros(1, *shape[1:]))
    calib = _data(shape, seed)
    for x in calib:
        x[..., :quiet] *= 1e-6  # (near-silent samples)
    messages = []
    q = npuforge.quantize(graph, calib, config or {}, log=messages.append)
    return graph, q, calib, messages


def _node_errors(q, x, ops, rounding) -> dict:
    """{node: (largest |code difference|, count, size)}: the integer simulator's output codes of each
    node of ``ops`` against its float op on the simulator's own input codes (quantized constants
    dequantized), rounded once to the output grid."""
    names = [n for n, v in q.values.items() if v.quant is not None and not v.is_const]
    codes = IntegerSimulator(q, rounding).run({q.inputs[0]: x}, outputs=names, dequantize=False)
    out = {}
    for node in (n for n in q.nodes if n.op in ops):
        ins = []
        for name in node.inputs:
            v = q.values[name] if name else None
            if v is None:
                ins.append(None)
            elif name in codes:
                ins.append(torch.from_numpy(v.quant.dequantize(codes[name])))
            elif v.quant is not None:
                ins.append(torch.from_numpy(v.quant.dequantize(v.quant.quantize(v.data))))
            else:
                ins.append(torch.from_numpy(np.array(v.data)))
        yq = q.values[node.outputs[0]].quant
        want = yq.quantize(get_op(node.op).forward(node, ins)[0].numpy()).astype(np.int64)
        diff = np.abs(codes[node.outputs[0]].astype(np.int64) - want)
        out[node.name] = (int(diff.max()), int((diff > 0).sum()), diff.size)
    return out


def _qdq_in_ort(q, x) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the file's own arithmetic
    sess = ort.InferenceSession(to_qdq_onnx(q).SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, {q.inputs[0]: x})[0]


def _end_to_end(graph, q, x, float_steps):
    out = q.outputs[0]
    step = float(q.values[out].quant.scale)
    ref = graph.run({graph.inputs[0]: x})[graph.outputs[0]]
    fake = run_fake_quant(q, {q.inputs[0]: x})[out]
    assert float_steps is None or np.abs(fake - ref).max() <= float_steps * step
    for rounding in ROUNDINGS:
        got = IntegerSimulator(q, rounding).run({q.inputs[0]: x})[out]
        assert np.abs(got - fake).max() <= 1.01 * step, rounding
    assert np.abs(_qdq_in_ort(q, x) - fake).max() <= 1.01 * step


# -- PRelu -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [{}, {"activation_dtype": "int8"}, {"tflite_multipliers": True}])
def test_prelu_is_quantized_with_an_int8_slope_and_two_requantizations(config):
    graph, q, calib, messages = _quantized(PReluNet(), (2, 3, 8, 8), config)
    assert not [m for m in messages if "kept in float" in m], messages
    per_channel, shared = (n for n in q.nodes if n.op == "PRelu")
    for node in (per_channel, shared):
        assert {"multiplier", "shift", "multiplier_neg", "shift_neg"} <= set(node.quant)
        assert q.values[node.inputs[1]].quant.dtype == "int8"
    slope = q.values[per_channel.inputs[1]]
    if config.get("tflite_multipliers"):  # TFLite's PRELU: one alpha scale
        assert slope.quant.axis is None
    else:  # one scale per channel: every slope exact to float32 (code +-127, or 0)
        assert slope.quant.axis == 0 and q.values[per_channel.quant["multiplier_neg"]].shape == (6, 1, 1)
        np.testing.assert_allclose(slope.quant.dequantize(slope.quant.quantize(slope.data)), slope.data, rtol=1e-6)
    for rounding in ROUNDINGS:
        for name, (worst, count, size) in _node_errors(q, calib[0], {"PRelu"}, rounding).items():
            assert worst <= 1 and count <= size // 200, (rounding, name, worst, count)
    _end_to_end(graph, q, calib[0], float_steps=4)


# -- Max / Min -------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [{}, {"activation_dtype": "int8"}])
def test_max_and_min_of_activations_requantize_each_operand_to_the_output_grid(config):
    graph, q, calib, messages = _quantized(MaxMinNet(), (2, 3, 8, 8), config)
    assert not [m for m in messages if "kept in float" in m], messages
    nodes = [n for n in q.nodes if n.op in ("Max", "Min")]
    assert len(nodes) == 3 and all(q.values[n.outputs[0]].quant is not None for n in nodes)
    two = [n for n in nodes if not any(q.values[i].is_const for i in n.inputs)]
    assert not q.values[two[0].inputs[0]].quant.same_as(q.values[two[0].inputs[1]].quant)  # two grids
    const = next(n for n in nodes if n not in two)
    assert "input1" in const.quant and q.values[const.quant["input1"]].shape == (4, 1, 1)  # output codes
    for rounding in ROUNDINGS:
        for name, (worst, count, size) in _node_errors(q, calib[0], {"Max", "Min"}, rounding).items():
            assert worst <= 1 and count <= size // 200, (rounding, name, worst, count)
    _end_to_end(graph, q, calib[0], float_steps=3)


def test_under_target_tflite_max_and_min_share_one_grid():
    """TFLite's MAXIMUM / MINIMUM compare codes: operands and output are one sharing group, and the
    requantizations are by 1 (the codes themselves)."""
    _, q, calib, _ = _quantized(MaxMinNet(), (1, 3, 8, 8), {"target": "tflite"})
    for node in (n for n in q.nodes if n.op in ("Max", "Min")):
        grids = [q.values[i].quant for i in node.inputs + node.outputs if not q.values[i].is_const]
        assert all(p.same_as(grids[0]) for p in grids)
    for worst, count, _ in _node_errors(q, calib[0], {"Max", "Min"}, "fixedpoint").values():
        assert worst == 0 and count == 0


# -- Clip with a computed bound (issue 37's quantizer crash) ---------------------------------------

@pytest.mark.parametrize("config", [{}, {"tflite_multipliers": True}])
def test_clip_with_a_bound_computed_from_the_data_quantizes(config):
    """Clip(x, ReduceMax(x) - 80) ended in "TypeError: can't convert np.ndarray of type numpy.object_"
    (quantize.py _lut; tflite_tables.py clip_bounds with tflite_multipliers). It is the Max of x and
    the bound, each requantized to the output grid."""
    shape = (1, 2, 64)
    graph, q, calib, messages = _quantized(DynamicRangeFloor(), shape, config, seed=3, quiet=8)  # below the floor
    clip = next(n for n in q.nodes if n.op == "Clip")
    assert not [m for m in messages if "kept in float" in m], messages
    assert not q.values[clip.inputs[1]].is_const and {"multiplier0", "multiplier1"} <= set(clip.quant)
    for rounding in ROUNDINGS:
        for name, (worst, count, size) in _node_errors(q, calib[0], {"Clip"}, rounding).items():
            assert worst <= 1 and count <= max(1, size // 100), (rounding, name, worst, count)
    x = calib[0]
    floor = graph.run({graph.inputs[0]: x})[graph.outputs[0]].max() - 80.0
    got = IntegerSimulator(q).run({q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(got[0, 0, :8] - floor).max() <= 1.01 * float(q.values[q.outputs[0]].quant.scale)
    # (float: x * x on an 8-bit grid loses the quiet samples' power, whatever the Clip's rule)
    _end_to_end(graph, q, x, float_steps=None)


def test_clip_with_a_computed_bound_under_target_tflite_is_a_clean_refusal_in_the_relu_kernels():
    from npuforge.quant.tflite_tables import clip_bounds

    _, q, _, _ = _quantized(DynamicRangeFloor(), (1, 2, 64), {"target": "tflite"})
    clip = next(n for n in q.nodes if n.op == "Clip")
    with pytest.raises(UnsupportedError, match=rf"node '{clip.name}' \(Clip\): its min bound .* computed from"):
        clip_bounds(q, clip)


@pytest.mark.parametrize("module, shape, config", [
    (MaxMinNet(), (1, 3, 8, 8), {}), (MaxMinNet(), (1, 3, 8, 8), {"target": "tflite"}),
    (MaxMinNet(), (1, 3, 8, 8), {"activation_dtype": "int8"}), (DynamicRangeFloor(), (1, 2, 64), {}),
    (PReluNet(), (1, 3, 8, 8), {}), (PReluNet(), (1, 3, 8, 8), {"tflite_multipliers": True})])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_the_lowered_engine_runs_minmax_and_prelu_as_the_plain_path(module, shape, config, rounding):
    """ONNX Runtime's program reads each operand's requantization (a PRelu's result per slope
    element) from a table of every code, in both forms of the lowering (the qoperator form's
    for uint8 activations)."""
    from npuforge.sim.lowered import LoweredSimulator

    _, q, calib, _ = _quantized(module, shape, config, seed=3)
    plain = IntegerSimulator(q, rounding)
    uint8 = q.values[q.inputs[0]].quant.dtype == "uint8"
    for form in ("qoperator", "float") if uint8 else ("float",):
        lowered = LoweredSimulator(q, rounding, form=form)
        assert not [n for n, how in lowered.lowering.items() if how.startswith("in float (kept")]
        for x in calib + [c * 4 for c in calib]:
            a = plain.run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]]
            b = lowered.run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]]
            np.testing.assert_array_equal(a, b)


# -- NaN and infinity ------------------------------------------------------------------------------

class LinearAttentionNorm(nn.Module):
    """``x / (sum + 1e-5)``: the epsilon is below the sum's grid step, so a row of zeros divides 0 by 0
    (here in the Div kept in float; quantized, tests/test_div_rule.py)."""

    def forward(self, x):
        r = torch.relu(x)
        return r / (r.sum(-1, keepdim=True) + 1e-5)


def test_nan_or_infinity_is_an_error_naming_the_node_never_a_code():
    graph = npuforge.from_torch(LinearAttentionNorm().eval(), torch.zeros(1, 4, 8))
    calib = [x + 1.0 for x in _data((2, 4, 8), 0, 2)]
    messages = []
    div = next(n for n in graph.nodes if n.op == "Div")
    q = npuforge.quantize(graph, calib, {"keep_float": [div.name]}, log=messages.append)
    assert any(f"'{div.name}' (Div) kept in float" in m for m in messages)
    x = calib[0].copy()
    x[0, 1] = -1.0  # a row of zeros after the Relu: 0 / 0
    pattern = rf"^node '{div.name}' \(Div\) output '{div.outputs[0]}' holds 8 NaN value\(s\) of 64 in {{}}: "
    with pytest.raises(NpuforgeError, match=pattern.format("the integer simulator")):
        IntegerSimulator(q).run({q.inputs[0]: x})
    for precision in ("float32", "float64"):
        with pytest.raises(NpuforgeError, match=pattern.format("fake-quant")):
            run_fake_quant(q, {q.inputs[0]: x}, precision=precision)
    bad = calib[0].copy()
    bad[1, 2, 3] = np.inf
    with pytest.raises(NpuforgeError, match=r"^input '.*' holds 1 infinite value\(s\) of 64 in the integer simulator"):
        IntegerSimulator(q).run({q.inputs[0]: bad})
    with pytest.raises(NpuforgeError, match=r"^input '.*' holds 1 infinite value\(s\) of 64 in fake-quant"):
        run_fake_quant(q, {q.inputs[0]: bad})
    # the remedy the message gives: the node adding the epsilon kept in float
    add = next(n.name for n in q.nodes if n.op == "Add")
    kept = npuforge.quantize(graph, calib, {"keep_float": [add, div.name]}, log=lambda m: None)
    assert np.isfinite(IntegerSimulator(kept).run({kept.inputs[0]: x})[kept.outputs[0]]).all()


def test_an_infinity_out_of_a_quantized_table_op_saturates_as_its_table_does():
    """log(0) = -inf inside a quantized Log is the grid's lowest code in its table and in fake-quant
    alike (no NaN or infinity is computed in float there)."""
    graph = npuforge.from_torch(_LogOfRelu().eval(), torch.zeros(1, 8))
    calib = [np.abs(x) + 0.1 for x in _data((4, 8), 1, 2)]
    q = npuforge.quantize(graph, calib, log=lambda msg: None)
    assert any(n.op == "Log" and "lut" in n.quant for n in q.nodes)
    x = calib[0].copy()
    x[0, :4] = -1.0  # log(relu(-1)) = log(0)
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    got = IntegerSimulator(q).run({q.inputs[0]: x})[q.outputs[0]]
    p = q.values[q.outputs[0]].quant
    assert np.array_equal(fake, got) and (got[0, :4] == p.dequantize(np.array(p.qmin))).all()


class _LogOfRelu(nn.Module):
    def forward(self, x):
        return torch.log(torch.relu(x))


# -- TFLite's PRELU: the same integers ------------------------------------------------------------

def test_litert_reference_prelu_computes_the_rule_bit_for_bit():
    """LiteRT's reference int8 PRELU (two MultiplyByQuantizedMultiplier, alpha an int8 tensor with its
    own zero point) against the integer simulator, on an int8 TFLite model imported as it is: random
    grids, alpha zero points and codes, every input code."""
    litert = pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")
    from tflite.BuiltinOperator import BuiltinOperator

    from npuforge.export.tflite_writer import TensorQuant, TFLiteWriter
    from npuforge.frontend.tflite_importer import import_tflite

    rng = np.random.default_rng(0)
    shape = (1, 4, 64, 3)
    x = np.arange(-128, 128, dtype=np.int64).reshape(1, 4, 64, 1).repeat(3, axis=3).astype(np.int8)
    for _ in range(8):
        grids = [TensorQuant(np.array([rng.uniform(0.005, 0.1)], np.float32), np.array([rng.integers(-60, 60)]))
                 for _ in range(3)]
        w = TFLiteWriter()
        xt, yt = w.tensor("x", shape, "int8", quant=grids[0]), w.tensor("y", shape, "int8", quant=grids[1])
        alpha = w.tensor("alpha", (1, 1, 3), "int8", data=rng.integers(-128, 128, (1, 1, 3)).astype(np.int8),
                         quant=grids[2])
        w.operator(BuiltinOperator.PRELU, [xt, alpha], [yt])
        model = w.finish([xt], [yt])
        it = litert.Interpreter(model_content=model, experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        ref = it.get_tensor(it.get_output_details()[0]["index"])
        g = import_tflite(model, name="prelu.tflite")
        assert [n.op for n in g.nodes] == ["PRelu"]
        got = IntegerSimulator(g).run({g.inputs[0]: x.transpose(0, 3, 1, 2)}, dequantize=False)[g.outputs[0]]
        assert np.array_equal(got.transpose(0, 2, 3, 1), ref)
