"""--input-value NAME=V[,V...] / input_shapes={NAME: np.array(...)}: an ONNX graph input fixed to a
constant at import, so that an If on its value (Silero VAD's sample rate ``sr``) folds (issue 37)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import npuforge
from npuforge.cli import parse_input_shapes, main
from npuforge.errors import NpuforgeError

def _branch(name: str, k: float) -> onnx.GraphProto:
    c = h.make_node("Constant", [], [f"{name}_k"], value=h.make_tensor(f"{name}_kv", T.FLOAT, [], [k]))
    m = h.make_node("Mul", ["x", f"{name}_k"], [f"{name}_y"])
    return h.make_graph([c, m], name, [], [h.make_tensor_value_info(f"{name}_y", T.FLOAT, None)])


def _sr_model() -> onnx.ModelProto:
    """y = x * 2 if sr == 16000 else x * 3; x float [1, 4], sr an int64 scalar."""
    nodes = [h.make_node("Constant", [], ["c16k"], value=h.make_tensor("c16kv", T.INT64, [], [16000])),
             h.make_node("Equal", ["sr", "c16k"], ["cond"]),
             h.make_node("If", ["cond"], ["y"], then_branch=_branch("then", 2.0), else_branch=_branch("else", 3.0))]
    g = h.make_graph(nodes, "sr_if", [h.make_tensor_value_info("x", T.FLOAT, [1, 4]),
                                      h.make_tensor_value_info("sr", T.INT64, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.fixture(scope="module")
def sr_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("iv") / "sr_if.onnx"
    onnx.save(_sr_model(), path)
    return path


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code, err, fragment):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("npuforge: error: ") and fragment in lines[0], err


def _ort(path, x, sr):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "sr": np.array(sr, np.int64)})[0]


def test_without_input_value_the_if_selects_at_run_time(sr_model, capsys, tmp_path):
    """sr stays an input: both branches and a Where (tests/test_if_select.py), which needs sr's values."""
    code, out, _ = _cli(capsys, "inspect", sr_model, "--json")
    summary = json.loads(out)
    assert code == 0 and [i["name"] for i in summary["inputs"]] == ["x", "sr"]
    graph = npuforge.load(sr_model)
    assert graph.nodes[-1].op == "Where"
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    for sr in (16000, 8000):
        assert np.array_equal(graph.run({"x": x, "sr": np.array(sr, np.int64)})["y"], _ort(sr_model, x, sr))
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "0.npy", np.ones((1, 4), np.float32))
    code, _, err = _cli(capsys, "quantize", sr_model, "--calib", calib, "--num-calib", 1, "-o", tmp_path / "q.nfir")
    _one_line_error(code, err, "this one has inputs x, sr")


@pytest.mark.parametrize("sr, factor", [(16000, 2.0), (8000, 3.0)])
def test_input_value_folds_the_if(sr_model, capsys, tmp_path, sr, factor):
    code, out, _ = _cli(capsys, "inspect", sr_model, "--input-value", f"sr={sr}", "--json")
    summary = json.loads(out)
    assert code == 0 and [i["name"] for i in summary["inputs"]] == ["x"]
    out_ir = tmp_path / "o.nfir"
    code, _, _ = _cli(capsys, "optimize", sr_model, "--input-value", f"sr={sr}", "--output", out_ir)
    assert code == 0
    graph = npuforge.load(out_ir)
    assert graph.inputs == ["x"] and {n.op for n in graph.nodes} == {"Mul"}
    x = np.random.default_rng(sr).standard_normal((1, 4)).astype(np.float32)
    y = graph.run({"x": x})["y"]
    ref = _ort(sr_model, x, sr)
    assert np.array_equal(y, ref) and np.allclose(ref, x * factor)


def test_quantize_with_input_value(sr_model, capsys, tmp_path):
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(4):
        np.save(calib / f"{i}.npy", np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32))
    out = tmp_path / "q.nfir"
    code, _, err = _cli(capsys, "quantize", sr_model, "--calib", calib, "--num-calib", 4, "--input-value", "sr=8000",
                        "-o", out)
    assert code == 0, err
    assert npuforge.load(out).inputs == ["x"]


def test_python_api(sr_model):
    x = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
    graph = npuforge.load(sr_model, input_shapes={"sr": np.array(16000)})
    assert graph.inputs == ["x"] and "If" not in {n.op for n in graph.nodes}
    assert np.array_equal(graph.run({"x": x})["y"], _ort(sr_model, x, 16000))
    graph = npuforge.import_onnx(_sr_model(), input_shapes={"sr": np.int64(8000)})
    assert np.array_equal(graph.run({"x": x})["y"], _ort(sr_model, x, 8000))
    assert npuforge.load(sr_model).inputs == ["x", "sr"]  # not fixed: selected at run time


def test_parse_input_shapes_takes_both_lists():
    got = parse_input_shapes(["x=1,4"], ["sr=16000", "w=0.5,2"])
    assert got["x"] == (1, 4)
    assert got["sr"].dtype == np.int64 and got["sr"].tolist() == [16000]
    assert got["w"].dtype == np.float64 and got["w"].tolist() == [0.5, 2.0]


def test_constant_takes_the_inputs_dtype_and_shape():
    """A 0-d input becomes a scalar, a float input keeps float32, a dynamic 1-d dim takes the value count."""
    g = h.make_graph([h.make_node("Cast", ["k"], ["kf"], to=T.FLOAT), h.make_node("Mul", ["a", "b"], ["ab"]),
                      h.make_node("Mul", ["ab", "kf"], ["y"])], "g",
                     [h.make_tensor_value_info("a", T.FLOAT, [1, "n"]), h.make_tensor_value_info("b", T.FLOAT, ["n"]),
                      h.make_tensor_value_info("k", T.INT32, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, "n"])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    from npuforge.frontend import onnx_importer

    graph = onnx_importer.Graph("g")
    graph.add_value(onnx_importer._input_value(m.graph.input[1], "m"))
    graph.add_value(onnx_importer._input_value(m.graph.input[2], "m"))
    graph.inputs += ["b", "k"]
    assert onnx_importer._fix_input_shapes(graph, {"b": np.array([1, 2, 3]), "k": np.array([5])}, "m") == ["b", "k"]
    assert graph.inputs == []
    assert graph.values["b"].data.dtype == np.float32 and graph.values["b"].shape == (3,)
    assert graph.values["k"].data.dtype == np.int32 and graph.values["k"].data.shape == () == graph.values["k"].shape
    graph = npuforge.import_onnx(m, input_shapes={"b": np.array([1.0, 2.0, 3.0]), "k": np.array(2)})
    assert graph.inputs == ["a"]
    a = np.array([[1, 1, 2]], np.float32)
    assert graph.run({"a": a})["y"].tolist() == [[2.0, 4.0, 12.0]]


@pytest.mark.parametrize("spec, fragment", [
    ("rate=16000", "--input-value names 'rate', which is not a graph input; inputs: x, sr"),
    ("sr=16k", "--input-value sr=16k: '16k' is not a number"),
    ("sr=", "--input-value sr=: write NAME=V[,V...]"),
    ("sr=16000,8000", "--input-value sr: too many values: 2 given, but the input (int64[]) holds 1"),
    ("x=1,2,3", "--input-value x: too few values: 3 given, but the input (float32[1, 4]) holds 4"),
    ("sr=16000.5", "--input-value sr: 16000.5 is not an integer, and the input is int64"),
])
def test_input_value_errors_are_one_line(sr_model, capsys, spec, fragment):
    code, _, err = _cli(capsys, "inspect", sr_model, "--input-value", spec)
    _one_line_error(code, err, fragment)


def test_input_value_and_shape_of_one_input(sr_model, capsys):
    code, _, err = _cli(capsys, "inspect", sr_model, "--input-value", "sr=16000", "--input-shape", "sr=1")
    _one_line_error(code, err, "--input-value sr: the input has an --input-shape too")


def test_input_value_is_for_onnx_only(sr_model, capsys, tmp_path):
    ir = tmp_path / "m.nfir"
    npuforge.save(npuforge.load(sr_model, input_shapes={"sr": np.array(16000)}), ir)
    for command in ("inspect", "check"):
        code, _, err = _cli(capsys, command, ir, "--input-value", "sr=16000")
        _one_line_error(code, err, "--input-value sr: a saved IR, not an ONNX file; --input-value is for ONNX models "
                                   "only")
    tfl = tmp_path / "m.tflite"
    tfl.write_bytes(b"\0\0\0\0TFL3" + bytes(16))
    code, _, err = _cli(capsys, "inspect", tfl, "--input-value", "sr=16000")
    _one_line_error(code, err, "--input-value sr: a TFLite model, not an ONNX file; --input-value is for ONNX "
                               "models only")
    with pytest.raises(NpuforgeError, match="ONNX models only"):
        npuforge.load(tfl, input_shapes={"sr": np.array(16000)})
