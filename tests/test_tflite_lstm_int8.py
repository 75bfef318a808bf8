"""The int8 LSTM (UNIDIRECTIONAL_SEQUENCE_LSTM's 8x8_16 kernel) imported from .tflite files
written here as TensorFlow's converter writes them: the integer simulator's output codes equal
LiteRT's, reference and optimized kernels, bit for bit; the float IR is the float LSTM on the
dequantized weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

litert = pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")

from npuforge.errors import ModelFormatError, UnsupportedError  # noqa: E402
from npuforge.export.litert_check import interpreter, run_litert  # noqa: E402
from npuforge.export.tflite_export import to_tflite  # noqa: E402
from npuforge.export.tflite_writer import TensorQuant, TFLiteWriter  # noqa: E402
from npuforge.frontend.tflite_importer import import_tflite  # noqa: E402
from npuforge.quant.lstm_rule import logistic_q15, tanh_q15  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402
from tflite.BuiltinOperator import BuiltinOperator  # noqa: E402
from tflite.BuiltinOptions import BuiltinOptions  # noqa: E402


def _q(scale, zp=0) -> TensorQuant:
    return TensorQuant(np.array([scale], np.float32), np.array([zp]))


def int8_lstm_model(batch=2, steps=6, n_in=5, n_cell=8, n_out=None, cifg=False, peephole=False, proj=False,
                    time_major=False, cell_clip=0.0, proj_clip=0.0, x_q=(0.03, 3), h_q=(1 / 128, -2),
                    cell_log2=-11, hidden_q=(2**-7, 0), weight_scale=0.02, proj_scale=0.01, seed=0, act=4, norm=False,
                    intermediates=5, gate_scale=2**-12, ln_scale=6e-5, norm_gates="ifco") -> bytes:
    """A one-LSTM int8 model x -> y: 24 inputs (-1 where omitted), h and c variable int8 / int16
    tensors, five intermediates (the fifth holding the hidden state's parameters)."""
    rng = np.random.default_rng(seed)
    n_out = n_out or n_cell
    w = TFLiteWriter()
    xs = (steps, batch, n_in) if time_major else (batch, steps, n_in)
    x = w.tensor("x", xs, "int8", quant=_q(*x_q))
    skip = lambda g: g == "i" and cifg  # noqa: E731

    def weights(name, *shape, scale=weight_scale):
        return w.tensor(name, shape, "int8", rng.integers(-127, 128, shape).astype(np.int8), _q(scale))

    ins = [x]
    ins += [-1 if skip(g) else weights(f"W_{g}", n_cell, n_in) for g in "ifco"]
    ins += [-1 if skip(g) else weights(f"R_{g}", n_cell, n_out) for g in "ifco"]
    ins += [w.tensor(f"p_{g}", (n_cell,), "int16", rng.integers(-20000, 20000, n_cell).astype(np.int16),
                     _q(3e-5)) if peephole and not skip(g) else -1 for g in "ifo"]
    ins += [-1 if skip(g) else w.tensor(f"b_{g}", (n_cell,), "int32",
                                         rng.integers(-3000, 3000, n_cell).astype(np.int32),
                                         _q(weight_scale * x_q[0])) for g in "ifco"]
    if proj:
        ins += [weights("P", n_out, n_cell, scale=proj_scale),
                w.tensor("Pb", (n_out,), "int32", rng.integers(-500, 500, n_out).astype(np.int32),
                         _q(proj_scale * hidden_q[0]))]
    else:
        ins += [-1, -1]
    ins += [w.tensor("h0", (batch, n_out), "int8", quant=_q(*h_q), variable=True),
            w.tensor("c0", (batch, n_cell), "int16", quant=_q(2.0**cell_log2), variable=True)]
    ins += [w.tensor(f"ln_{g}", (n_cell,), "int16", rng.integers(5000, 25000, n_cell).astype(np.int16),
                     _q(ln_scale)) if norm and g in norm_gates and not skip(g) else -1 for g in "ifco"]
    inter = [w.tensor(f"gate_{g}", (batch, n_cell), "int16", quant=_q(gate_scale)) for g in "ifco"]
    inter += [w.tensor("hidden", (batch, n_cell), "int8", quant=_q(*hidden_q))]
    y = w.tensor("y", (steps, batch, n_out) if time_major else (batch, steps, n_out), "int8", quant=_q(*h_q))
    w.operator(BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, [y], "UnidirectionalSequenceLSTMOptions",
               BuiltinOptions.UnidirectionalSequenceLSTMOptions, intermediates=inter[:intermediates],
               FusedActivationFunction=act, CellClip=cell_clip, ProjClip=proj_clip, TimeMajor=time_major)
    return w.finish([x], [y])


CASES = {
    "plain": {},
    "cifg": dict(cifg=True),
    "peephole": dict(peephole=True),
    "projection": dict(proj=True, n_out=5),
    "projection_peephole_clips": dict(proj=True, n_out=4, peephole=True, cell_clip=0.9, proj_clip=0.5),
    "cifg_peephole_cell_clip": dict(cifg=True, peephole=True, cell_clip=0.6),
    "time_major": dict(time_major=True, peephole=True),
    "time_major_projection_peephole": dict(time_major=True, peephole=True, proj=True, n_out=3, batch=3),
    "hidden_zero_point": dict(hidden_q=(2**-7, 5), h_q=(2**-7, 5)),
    "hidden_zero_point_projection": dict(hidden_q=(2**-7, -6), proj=True, n_out=6),
    "coarse_cell": dict(cell_log2=-9, weight_scale=0.05),
    "fine_cell": dict(cell_log2=-15),
    "large_scales": dict(x_q=(0.1, -7), weight_scale=0.08),
    "one_step_batch_one": dict(batch=1, steps=1),
    "layer_norm": dict(norm=True, gate_scale=0.002),
    "layer_norm_cifg_peephole_projection": dict(norm=True, gate_scale=0.003, cifg=True, peephole=True, proj=True,
                                                n_out=4, cell_clip=0.7),
    "layer_norm_fine_gates": dict(norm=True, gate_scale=2**-12, ln_scale=2e-5, time_major=True),
    "layer_norm_coarse_gates": dict(norm=True, gate_scale=0.02, weight_scale=0.05),
}


def _codes(model: bytes, seed: int) -> np.ndarray:
    shape = interpreter(model).get_input_details()[0]["shape"]
    return np.random.default_rng(100 + seed).integers(-128, 128, shape).astype(np.int8)


@pytest.mark.parametrize("case", CASES)
def test_int8_lstm_equals_litert_bit_for_bit(case):
    model = int8_lstm_model(**CASES[case])
    graph = import_tflite(model, "lstm")
    assert [n.op for n in graph.nodes] == ["SequenceLSTM"]
    sim = IntegerSimulator(graph)
    for seed in range(3):
        x = _codes(model, seed)
        ours = sim.run({graph.inputs[0]: x}, dequantize=False)[graph.outputs[0]]
        for reference in (True, False):
            theirs = run_litert(interpreter(model, reference), [x])[0]
            assert ours.dtype == np.int8
            np.testing.assert_array_equal(ours, theirs, err_msg=f"seed {seed}, reference kernels {reference}")


@pytest.mark.parametrize("kwargs", [dict(peephole=True), dict(peephole=True, proj=True, n_out=6, proj_scale=0.002),
                                    dict(cifg=True, cell_clip=0.5), dict(norm=True, gate_scale=0.0005)])
def test_int8_lstm_float_ir_is_the_dequantized_lstm(kwargs):
    """The float graph (the dequantized weights through the float LSTM) stays within a few output
    steps of LiteRT's int8 run over six time steps (measured: 2.7 to 3.5): the same network."""
    model = int8_lstm_model(weight_scale=0.005, **kwargs)
    graph = import_tflite(model, "lstm")
    yq = graph.values[graph.outputs[0]].quant
    x = _codes(model, 0)
    theirs = yq.dequantize(run_litert(interpreter(model), [x])[0])
    ours = graph.run({graph.inputs[0]: graph.values[graph.inputs[0]].quant.dequantize(x)})[graph.outputs[0]]
    assert np.abs(ours - theirs).max() < 5 * float(yq.scale)


def test_gemmlowp_tables_are_logistic_and_tanh():
    """The int16 tables against the real functions: within gemmlowp's few-ulp error, odd / symmetric."""
    x = np.arange(-32768, 32768)
    sig = logistic_q15(3).numpy() / 2**15
    assert np.abs(sig - 1 / (1 + np.exp(-x / 2**12))).max() < 4e-4
    for bits in range(7):
        th = tanh_q15(bits).numpy()
        assert np.abs(th / 2**15 - np.tanh(x / 2.0 ** (15 - bits))).max() < 4e-4, bits
        assert np.array_equal(th[1:][::-1], -th[1:])  # tanh(-x) = -tanh(x), exactly


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(norm=True, norm_gates="fc"), ModelFormatError, "layer-norm coefficients for gates \\['f', 'c'\\] only"),
    (dict(act=3), UnsupportedError, "cell activation other than TANH"),
    (dict(intermediates=4), ModelFormatError, "4 intermediate tensors"),
    (dict(cell_log2=-8), UnsupportedError, "cell state of scale 0.00390625"),
    (dict(h_q=(1 / 128, -2), hidden_q=(2**-7, 0)), None, None),
])
def test_int8_lstm_refusals_name_the_operator(kwargs, error, match):
    if error is None:
        import_tflite(int8_lstm_model(**kwargs), "m.tflite")
        return
    with pytest.raises(error, match=rf"^m\.tflite: operator 0 \(UNIDIRECTIONAL_SEQUENCE_LSTM\).*{match}"):
        import_tflite(int8_lstm_model(**kwargs), "m.tflite")


@pytest.mark.parametrize("case", ["plain", "projection_peephole_clips", "cifg_peephole_cell_clip",
                                  "time_major_projection_peephole", "hidden_zero_point_projection"])
def test_int8_lstm_exports_to_tflite_and_back(case):
    """The imported IR written as int8 TFLite again: LiteRT runs the export to the same codes, and
    importing the export gives the same integers."""
    model = int8_lstm_model(**CASES[case])
    graph = import_tflite(model, "lstm")
    exported = to_tflite(graph)
    again = import_tflite(exported, "again")
    (node,), (back,) = graph.nodes, again.nodes
    assert node.attrs == back.attrs
    for role in node.quant:
        np.testing.assert_array_equal(graph.values[node.quant[role]].data, again.values[back.quant[role]].data)
    x = _codes(model, 0)
    want = run_litert(interpreter(model), [x])[0]
    np.testing.assert_array_equal(run_litert(interpreter(exported), [x])[0], want)
    np.testing.assert_array_equal(IntegerSimulator(again).run({again.inputs[0]: x}, dequantize=False)[again.outputs[0]],
                                  want)


def test_int8_lstm_from_the_command_line(tmp_path, capsys):
    """run --mode int, a saved IR, export --format tflite --check-litert (each check from zero
    states), compile (the LSTM on the host CPU) and the program's run all give LiteRT's codes;
    --format onnx is refused in one line and writes nothing."""
    import npuforge
    from npuforge.cli import main

    model = tmp_path / "lstm.tflite"
    model.write_bytes(int8_lstm_model(batch=1, peephole=True, proj=True, n_out=6, norm=True, gate_scale=0.002))
    graph = import_tflite(model)
    x = np.random.default_rng(7).uniform(-1, 1, (1, 6, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    codes = graph.values["x"].quant.quantize(x)
    want = graph.values["y"].quant.dequantize(run_litert(interpreter(model.read_bytes()), [codes])[0])
    npuforge.save(graph, tmp_path / "lstm.nfir")
    for source, out, mode in ((model, "int.npz", ["--mode", "int"]), (tmp_path / "lstm.nfir", "ir.npz", ["--mode", "int"])):
        assert main(["run", str(source), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / out), *mode]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / out)["y"], want)
    assert main(["export", str(model), "--format", "tflite", "-o", str(tmp_path / "out.tflite"),
                 "--check-litert", "3"]) == 0
    assert "3/3 random inputs bit-exact" in capsys.readouterr().out
    assert main(["export", str(model), "--format", "onnx", "-o", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no ONNX form" in err and not (tmp_path / "out.onnx").exists()
    assert main(["compile", str(model), "-o", str(tmp_path / "lstm.npub")]) == 0
    assert "on the host CPU (SequenceLSTM 1)" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "lstm.npub"), "--input", str(tmp_path / "x.npy"), "--output",
                 str(tmp_path / "npub.npz")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "npub.npz")["y"], want)


CONVERTER_FILES = sorted((Path(__file__).parent / "data" / "tflite_lstm_int8").glob("*.tflite"))


@pytest.mark.filterwarnings("ignore:.*a cell state of scale 2\\^-16")
@pytest.mark.parametrize("path", CONVERTER_FILES, ids=lambda p: p.stem)
def test_tensorflow_converter_files_equal_litert(path):
    """Int8 LSTMs as TensorFlow's converter writes them (scripts/make_int8_lstm_fixtures.py): one or
    two LSTMs, a Dense on either side (FULLY_CONNECTED with keep_num_dims), the last step only, up to
    20 steps; cell scales 2^-14 to 2^-16 (two at 2^-16, where LiteRT skips the cell's tanh)."""
    model = path.read_bytes()
    graph = import_tflite(model, path.stem)
    assert "SequenceLSTM" in [n.op for n in graph.nodes]
    sim = IntegerSimulator(graph)
    for seed in range(3):
        x = _codes(model, seed)
        ours = sim.run({graph.inputs[0]: x}, dequantize=False)[graph.outputs[0]]
        for reference in (True, False):
            np.testing.assert_array_equal(ours, run_litert(interpreter(model, reference), [x])[0])


def test_a_cell_scale_below_2_to_the_15_is_reproduced_with_a_warning_and_refused_under_cifg():
    """LiteRT's int16 tanh takes 0 to 6 integer bits: at a 2^-16 cell scale it multiplies the output
    gate by the input gate left in its buffer (reproduced, with a warning); under CIFG that buffer is
    never written, so the import refuses."""
    with pytest.warns(UserWarning, match=r"a cell state of scale 2\^-16: LiteRT's int8 LSTM skips the cell's tanh"):
        graph = import_tflite(int8_lstm_model(cell_log2=-16), "m")
    model = int8_lstm_model(cell_log2=-16)
    x = _codes(model, 0)
    np.testing.assert_array_equal(IntegerSimulator(graph).run({graph.inputs[0]: x}, dequantize=False)[graph.outputs[0]],
                                  run_litert(interpreter(model), [x])[0])
    with pytest.raises(UnsupportedError, match=r"cell state of scale 2\^-16 in a CIFG LSTM"):
        import_tflite(int8_lstm_model(cell_log2=-16, cifg=True), "m")
