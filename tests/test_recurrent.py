"""ONNX LSTM, GRU and RNN unrolled at import (frontend/onnx_recurrent.py): float equal to
ONNX Runtime on random shapes, directions, layouts, activations and optional inputs; the
unrolled graph quantizes and its integer simulator follows fake-quant."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import npuforge
from npuforge.errors import NpuforgeError
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.integer import IntegerSimulator
from npuforge.sim.lowered import make_simulator

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
ACTS = ["Sigmoid", "Tanh", "Relu", "LeakyRelu", "HardSigmoid", "Elu", "Softsign", "Softplus", "Affine", "ScaledTanh",
        "ThresholdedRelu"]


def recurrent_model(kind, seq, batch, size, hidden, direction="forward", layout=0, seed=0, bias=True,
                    initial=False, peephole=False, outputs=("Y", "Y_h", "Y_c"), **attrs):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[kind]
    inits = [helper.make_tensor("W", TensorProto.FLOAT, (dirs, g * hidden, size),
                                rng.normal(0, 0.5, (dirs, g * hidden, size)).astype(np.float32).ravel()),
             helper.make_tensor("R", TensorProto.FLOAT, (dirs, g * hidden, hidden),
                                rng.normal(0, 0.5, (dirs, g * hidden, hidden)).astype(np.float32).ravel())]
    ins = ["x", "W", "R", ""]
    if bias:
        inits.append(helper.make_tensor("B", TensorProto.FLOAT, (dirs, 2 * g * hidden),
                                        rng.normal(0, 0.3, 2 * dirs * g * hidden).astype(np.float32)))
        ins[3] = "B"
    xshape = (batch, seq, size) if layout else (seq, batch, size)
    sshape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)]
    if initial or peephole:
        ins += ["", "h0" if initial else ""]
        if initial:
            graph_inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, sshape))
        if kind == "LSTM":
            ins.append("c0" if initial else "")
            if initial:
                graph_inputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, sshape))
            if peephole:
                inits.append(helper.make_tensor("P", TensorProto.FLOAT, (dirs, 3 * hidden),
                                                rng.normal(0, 0.5, dirs * 3 * hidden).astype(np.float32)))
                ins.append("P")
    names = list(outputs[:3 if kind == "LSTM" else 2])
    node = helper.make_node(kind, ins, names, name="rnn", hidden_size=hidden, direction=direction, layout=layout,
                            **attrs)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n]
    model = helper.make_model(helper.make_graph([node], "g", graph_inputs, outs, inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    feeds = {"x": rng.normal(0, 1, xshape).astype(np.float32)}
    if initial:
        feeds["h0"] = rng.normal(0, 0.5, sshape).astype(np.float32)
        if kind == "LSTM":
            feeds["c0"] = rng.normal(0, 0.5, sshape).astype(np.float32)
    return model, feeds


def ort_reference(model, feeds) -> dict:
    """ONNX Runtime's outputs. It runs no batch-first recurrence (layout 1), so such a model runs
    as its layout-0 twin on transposed inputs, its outputs transposed back."""
    node = model.graph.node[0]
    if not any(a.name == "layout" and a.i == 1 for a in node.attribute):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    for a in twin.graph.node[0].attribute:
        if a.name == "layout":
            a.i = 0
    for vi in twin.graph.input:
        dims = vi.type.tensor_type.shape.dim
        dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    out = ort_reference(twin, {k: v.transpose(1, 0, 2) for k, v in feeds.items()})
    return {k: v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for k, v in out.items()}


def assert_matches_ort(model, feeds, atol=2e-5, discard_overflow=False):
    graph = npuforge.import_onnx(model)
    ours = graph.run(feeds)
    for name, ref in ort_reference(model, feeds).items():
        if discard_overflow:  # ONNX Runtime's Softplus is log(1 + exp(x)) as written: inf past x = 88 (ours: x)
            assume(np.isfinite(ref).all())
        assert ours[name].shape == ref.shape, name
        # (unbounded activations, Affine / Relu, can grow a state to 1e5: float32 rounding grows with it)
        np.testing.assert_allclose(ours[name], ref, atol=atol * max(1.0, float(np.abs(ref).max())), rtol=1e-4,
                                   err_msg=name)
    return graph


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_equals_onnxruntime(kind, direction, layout):
    model, feeds = recurrent_model(kind, seq=5, batch=2, size=3, hidden=4, direction=direction, layout=layout,
                                   initial=True, peephole=True)
    graph = assert_matches_ort(model, feeds)
    assert kind not in graph.op_histogram()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["LSTM", "GRU", "RNN"]), seq=st.integers(1, 6), batch=st.integers(1, 3),
       size=st.integers(1, 5), hidden=st.integers(1, 6),
       direction=st.sampled_from(["forward", "reverse", "bidirectional"]), layout=st.integers(0, 1),
       bias=st.booleans(), initial=st.booleans(), peephole=st.booleans(), seed=st.integers(0, 1000),
       clip=st.one_of(st.none(), st.floats(0.5, 3.0)), extra=st.integers(0, 1),
       acts=st.lists(st.sampled_from(ACTS), min_size=6, max_size=6),
       alphas=st.lists(st.floats(0.1, 1.5), max_size=4), betas=st.lists(st.floats(0.1, 1.0), max_size=4))
def test_recurrent_random_equals_onnxruntime(kind, seq, batch, size, hidden, direction, layout, bias, initial,
                                             peephole, seed, clip, extra, acts, alphas, betas):
    per = {"LSTM": 3, "GRU": 2, "RNN": 1}[kind] * (2 if direction == "bidirectional" else 1)
    attrs = {"activations": acts[:per]}
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    if clip is not None:
        attrs["clip"] = clip
    if kind == "LSTM":
        attrs["input_forget"] = extra
    if kind == "GRU":
        attrs["linear_before_reset"] = extra
    model, feeds = recurrent_model(kind, seq, batch, size, hidden, direction, layout, seed, bias, initial,
                                   peephole, **attrs)
    assert_matches_ort(model, feeds, atol=5e-5, discard_overflow=True)


def test_omitted_outputs_and_default_activations():
    model, feeds = recurrent_model("LSTM", 4, 1, 3, 5, "bidirectional", outputs=("", "Y_h", ""))
    assert_matches_ort(model, feeds)
    model, feeds = recurrent_model("GRU", 3, 2, 2, 3, outputs=("Y", ""))
    assert_matches_ort(model, feeds)


def test_torch_lstm_and_gru_export_import():
    """nn.LSTM / nn.GRU as torch.onnx exports them (two layers, batch_first, bidirectional)."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True)
            self.gru = torch.nn.GRU(16, 5, batch_first=True)

        def forward(self, x):
            y, _ = self.lstm(x)
            y, h = self.gru(y)
            return y, h

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 7, 6)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, x, buf, dynamo=False, input_names=["x"], output_names=["y", "h"], opset_version=14)
    model = onnx.load_from_string(buf.getvalue())
    assert {"LSTM", "GRU"} <= {n.op_type for n in model.graph.node}
    graph = assert_matches_ort(model, {"x": x.numpy()})
    with torch.no_grad():
        ref = net(x)
    np.testing.assert_allclose(graph.run({"x": x.numpy()})["y"], ref[0].numpy(), atol=2e-5)


def test_unrolled_lstm_quantizes_and_simulates():
    """The unrolled graph has nothing left in float; fake-quant follows float, and the
    integer simulator (plain and ONNX Runtime lowering) follows fake-quant."""
    model, _ = recurrent_model("LSTM", 6, 1, 4, 8, "bidirectional", outputs=("Y", "", ""))
    graph = npuforge.import_onnx(model)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.normal(0, 1, (6, 1, 4)).astype(np.float32)} for _ in range(16)]
    q = npuforge.quantize(graph, calib)
    assert q.metadata["quantization"]["float_nodes"] == []
    feeds = {"x": rng.normal(0, 1, (6, 1, 4)).astype(np.float32)}
    ref = graph.run(feeds)["Y"]
    fake = run_fake_quant(q, feeds)["Y"]
    step = float(q.values["Y"].quant.scale)
    assert np.abs(fake - ref).max() < 0.1
    plain = IntegerSimulator(q, "fixedpoint").run(feeds)["Y"]
    assert np.abs(plain - fake).max() <= 2 * step
    np.testing.assert_array_equal(make_simulator(q, "fixedpoint").run(feeds)["Y"], plain)


def test_recurrent_refusals_are_one_line():
    model, _ = recurrent_model("LSTM", 3, 1, 2, 2)
    model.graph.node[0].input.extend(["seq_lens"])
    model.graph.input.append(helper.make_tensor_value_info("seq_lens", TensorProto.INT32, (1,)))
    with pytest.raises(NpuforgeError, match=r"node 'rnn' \(LSTM\): sequence_lens 'seq_lens' is not known"):
        npuforge.import_onnx(model)
    model, _ = recurrent_model("RNN", 3, 1, 2, 2, activations=["Gelu"])
    with pytest.raises(NpuforgeError, match=r"activation 'Gelu' is not one the ONNX spec allows"):
        npuforge.import_onnx(model)
    model, _ = recurrent_model("GRU", 3, 1, 2, 2)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    with pytest.raises(NpuforgeError, match=r"the sequence length of X .* --input-shape"):
        npuforge.import_onnx(model)
    assert npuforge.import_onnx(model, input_shapes={"x": (3, 1, 2)}).values["Y"].shape == (3, 1, 1, 2)
    with pytest.raises(NpuforgeError, match=r"a sequence of 5000 steps; npuforge unrolls GRU over at most 1024"):
        npuforge.import_onnx(model, input_shapes={"x": (5000, 1, 2)})


def test_recurrent_model_deploys_from_the_command_line(tmp_path, capsys):
    """A torch LSTM + GRU classifier, calibrated on .npy inputs: quantize --target tflite leaves nothing in
    float, the int8 TFLite file equals the integer simulator in LiteRT, and compile places it."""
    pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")
    from npuforge.cli import main

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(6, 8, batch_first=True)
            self.gru = torch.nn.GRU(8, 8, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(16, 3)

        def forward(self, x):
            y, _ = self.gru(self.lstm(x)[0])
            return self.fc(y[:, -1])

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), torch.zeros(1, 5, 6), str(tmp_path / "rnn.onnx"), dynamo=False,
                          input_names=["x"], output_names=["y"], opset_version=14)
    (tmp_path / "calib").mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        np.save(tmp_path / "calib" / f"{i}.npy", rng.normal(size=(1, 5, 6)).astype(np.float32))
    q = str(tmp_path / "q.nfir")
    assert main(["quantize", str(tmp_path / "rnn.onnx"), "--calib", str(tmp_path / "calib"), "--num-calib", "8",
                 "--target", "tflite", "-q", "-o", q]) == 0
    assert npuforge.load(q).metadata["quantization"]["float_nodes"] == []
    capsys.readouterr()
    assert main(["export", q, "--format", "tflite", "-o", str(tmp_path / "q.tflite"), "--check-litert", "3"]) == 0
    assert "3/3 random inputs bit-exact" in capsys.readouterr().out
    assert main(["compile", q, "-o", str(tmp_path / "q.npub")]) == 0


def test_lstm_weights_sliced_from_an_initializer_are_folded_at_import():
    """W computed from constants only (Unsqueeze(Slice(initializer)), as exporters write a layer's
    weights cut from one larger tensor) is folded at import, even past the size up to which values
    propagate during inference; a W that a graph input reaches is still refused."""
    model, feeds = recurrent_model("LSTM", 4, 1, 300, 64, seed=7)
    w = numpy_helper.to_array(model.graph.initializer[0])  # [1, 256, 300]
    big = np.concatenate([w[0], np.ones((44, 300), np.float32)])  # [300, 300]: 90,000 elements
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(big, "W_all"))
    model.graph.initializer.extend([numpy_helper.from_array(np.int64([0]), "starts"),
                                    numpy_helper.from_array(np.int64([256]), "ends"),
                                    numpy_helper.from_array(np.int64([0]), "axes")])
    cut = [helper.make_node("Slice", ["W_all", "starts", "ends", "axes"], ["W_rows"], name="cut"),
           helper.make_node("Unsqueeze", ["W_rows", "axes"], ["W"], name="unsqueeze")]
    model.graph.node.insert(0, cut[1])
    model.graph.node.insert(0, cut[0])
    assert_matches_ort(model, feeds)
    model.graph.input.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, (1,)))
    model.graph.node.insert(1, helper.make_node("Mul", ["W_rows", "scale"], ["W_scaled"], name="scaled"))
    model.graph.node[2].input[0] = "W_scaled"
    with pytest.raises(NpuforgeError, match=r"node 'rnn' \(LSTM\): its W 'W' is computed at run time"):
        npuforge.import_onnx(model)
