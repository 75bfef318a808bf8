"""An If decided by data (a wake-word model runs its verifier when its own score passes a
threshold): imported as both branches and a Where, quantized by the minmax rule (each
operand requantized to the output's grid, then selected), run by the lowered engine as the
plain path runs it, and written to TFLite as a comparison with an exact threshold code and
SELECT_V2 (against LiteRT's reference kernels on every code)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import npuforge
from npuforge.errors import UnsupportedError
from npuforge.export.onnx_export import to_qdq_onnx
from npuforge.quant import QuantConfig
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.float_exec import run_float
from npuforge.sim.integer import IntegerSimulator
from npuforge.sim.lowered import make_simulator

ort = pytest.importorskip("onnxruntime")


def _if_model(path, else_shape=(1, 4)) -> None:
    """score = sigmoid(x W1); if score >= 0.5: tanh(x W2) else x[:, :4] / 2 (or another shape)."""
    rng = np.random.default_rng(0)
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "W2"], ["t0"]), helper.make_node("Tanh", ["t0"], ["t1"])],
                               "then", [], [helper.make_tensor_value_info("t1", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "half"], ["e0"]),
                                helper.make_node("Slice", ["e0", "s0", "s1", "ax"], ["e1"])],
                               "else", [], [helper.make_tensor_value_info("e1", TensorProto.FLOAT, None)])
    inits = {"W1": rng.normal(size=(8, 1)), "W2": rng.normal(size=(8, 4)), "thr": np.float32(0.5),
             "half": np.float32(0.5), "s0": np.array([0], np.int64), "s1": np.array([else_shape[1]], np.int64),
             "ax": np.array([1], np.int64)}
    g = helper.make_graph([
        helper.make_node("MatMul", ["x", "W1"], ["s"]), helper.make_node("Sigmoid", ["s"], ["p"]),
        helper.make_node("ReduceMax", ["p"], ["pm"], keepdims=0),
        helper.make_node("GreaterOrEqual", ["pm", "thr"], ["c"]),
        helper.make_node("If", ["c"], ["y"], name="verify", then_branch=then_g, else_branch=else_g)],
        "if_on_score", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32) if np.asarray(v).dtype == np.float64 else np.asarray(v), k)
         for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _inputs(n: int, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(1, 8)) * (0.3 + 2 * (k % 3))).astype(np.float32) for k in range(n)]


@pytest.fixture(scope="module")
def if_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("if") / "if_on_score.onnx"
    _if_model(path)
    return path


def test_if_decided_by_data_imports_as_both_branches_and_a_where(if_model):
    graph = npuforge.load(if_model)
    assert "If" not in {n.op for n in graph.nodes} and [n.op for n in graph.nodes].count("Where") == 1
    session = ort.InferenceSession(str(if_model))
    xs = _inputs(12)
    for x in xs:
        np.testing.assert_allclose(np.asarray(run_float(graph, {"x": x})["y"]), session.run(None, {"x": x})[0],
                                   rtol=1e-6, atol=1e-6)
    decided = _scores(graph, xs)
    assert any(decided) and not all(decided), "the inputs take both branches"


def test_branches_of_different_shapes_are_refused_in_one_line(tmp_path):
    path = tmp_path / "mismatch.onnx"
    _if_model(path, else_shape=(1, 3))
    with pytest.raises(UnsupportedError) as e:
        npuforge.load(path)
    msg = str(e.value)
    assert "'verify'" in msg and "branches' outputs" in msg and "\n" not in msg


def _scores(graph, xs) -> list:
    return [bool(np.asarray(run_float(graph, {"x": x}, ["c"])["c"]).reshape(-1)[0]) for x in xs]


def test_the_where_is_quantized_and_every_engine_agrees(if_model):
    graph = npuforge.load(if_model)
    xs = _inputs(24)
    decided = _scores(graph, xs)
    assert any(decided) and not all(decided), "the inputs take both branches"
    q = npuforge.quantize(graph, [{"x": x} for x in xs[:12]], log=lambda m: None)
    where = next(n for n in q.nodes if n.op == "Where")
    assert {"multiplier1", "shift1", "multiplier2", "shift2"} <= set(where.quant)
    assert q.values["y"].quant is not None
    plain, lowered = IntegerSimulator(q), make_simulator(q, "fixedpoint", "ort")
    options = ort.SessionOptions()  # the QDQ file's float arithmetic: ORT's fused int8 MatMul saturates
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # on x86 without VNNI
    qdq = ort.InferenceSession(to_qdq_onnx(q).SerializeToString(), options, providers=["CPUExecutionProvider"])
    for x in xs:
        a, b = plain.run({"x": x}, dequantize=False), lowered.run({"x": x}, dequantize=False)
        np.testing.assert_array_equal(a["y"], b["y"])
        fq = np.asarray(run_fake_quant(q, {"x": x})["y"])
        np.testing.assert_array_equal(plain.run({"x": x})["y"], fq)
        np.testing.assert_allclose(qdq.run(None, {"x": x})[0], fq, atol=1e-6)


def test_where_and_the_comparison_export_to_tflite_bit_exact(if_model):
    pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")
    from npuforge.export.litert_check import compare
    from npuforge.export.tflite_export import to_tflite

    graph = npuforge.load(if_model)
    xs = _inputs(24)
    q = npuforge.quantize(graph, [{"x": x} for x in xs[:12]], QuantConfig(target="tflite"), log=lambda m: None)
    result = compare(q, to_tflite(q), [{"x": x} for x in xs])
    assert result["bit_exact_samples"] == len(xs), result


class _Threshold(torch.nn.Module):
    """y = where(op(x * gain, c), x * gain, 0): the comparison reads an activation on a grid the
    gain sets (gain 0.03: a scale below 2^-8, where LiteRT's rescaling merges codes)."""

    def __init__(self, op, c: float, gain: float, constant_first: bool):
        super().__init__()
        self.op, self.c, self.gain, self.constant_first = op, c, gain, constant_first

    def forward(self, x):
        v = x * self.gain
        cond = self.op(torch.tensor(self.c), v) if self.constant_first else self.op(v, torch.tensor(self.c))
        return torch.where(cond, v, torch.zeros(()))


@pytest.mark.parametrize("op", [torch.gt, torch.ge, torch.lt, torch.le, torch.eq])
@pytest.mark.parametrize("gain,c,constant_first", [(1.0, 0.37, False), (1.0, -1.1, True), (0.03, 0.011, False),
                                                   (1.0, 50.0, False), (0.03, -0.02, True)])
def test_comparisons_against_litert_on_every_code(op, gain, c, constant_first):
    pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")
    from npuforge.export.litert_check import interpreter, run_litert
    from npuforge.export.tflite_export import to_tflite

    module = _Threshold(op, c, gain, constant_first).eval()
    graph = npuforge.from_torch(module, torch.zeros(1, 64), dynamic_batch=False)
    rng = np.random.default_rng(0)
    calib = [{graph.inputs[0]: rng.uniform(-3, 3, (1, 64)).astype(np.float32)} for _ in range(4)]
    q = npuforge.quantize(graph, calib, QuantConfig(target="tflite"), log=lambda m: None)
    if op is torch.eq:  # a constant on the grid, so that one code is equal
        cmp = next(n for n in q.nodes if n.op == "Equal")
        x = next(i for i in cmp.inputs if not q.values[i].is_const)
        p = q.values[x].quant
        c_name = next(i for i in cmp.inputs if q.values[i].is_const)
        q.values[c_name].data = np.asarray((40 - int(p.zero_point)) * np.float32(p.scale), np.float32)
    try:
        model = to_tflite(q)
    except UnsupportedError as e:  # a grid finer than 2^-8 only, with the documented refusal in one line
        assert gain < 1 and "too fine for its rescaling" in str(e) and "\n" not in str(e)
        return
    p = q.values[graph.inputs[0]].quant
    codes = np.arange(p.qmin, p.qmax + 1)
    x = np.resize(codes, (4, 64)).astype(np.int8 if p.dtype == "int8" else np.uint8)
    sim, it = IntegerSimulator(q), interpreter(model)
    for row in x:
        feed = row[None, :]
        ours = sim.run({graph.inputs[0]: feed}, dequantize=False)[q.outputs[0]].astype(np.int64)
        theirs = run_litert(it, [feed])[0].astype(np.int64)
        np.testing.assert_array_equal(ours, theirs)
