"""Models as they are found in the wild: old opsets (upgraded on import) and dynamic
input sizes (fixed with --input-shape / input_shapes=)."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import npuforge
from npuforge.cli import main
from npuforge.errors import NpuforgeError
from npuforge.sim.float_exec import run_float


class OldOpsetNet(torch.nn.Module):
    """Ops whose ONNX spelling changed before opset 13: Clip (min/max attributes before
    11), Pad (pads attribute before 11), Upsample (before 10), Split / Squeeze /
    Unsqueeze / ReduceMean (axes attributes), Softmax (2-D coercion before 13)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x):
        y = torch.nn.functional.relu6(self.conv(x))
        a, b = torch.split(y, [4, 4], 1)
        y = torch.nn.functional.pad(a, (1, 0, 0, 1)) + torch.nn.functional.pad(b, (1, 0, 0, 1))
        y = torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
        y = y.mean((2, 3)).unsqueeze(-1).squeeze(-1)
        return torch.softmax(self.fc(y), 1)


def _export(model, x, **kwargs) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's notes on old opsets
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, buf, dynamo=False, input_names=["images"], output_names=["out"], **kwargs)
    return onnx.load_from_string(buf.getvalue())


@pytest.mark.parametrize("opset", [9, 10, 11, 12])
def test_old_opsets_are_upgraded_on_import(opset):
    torch.manual_seed(0)
    model = OldOpsetNet().eval()
    x = torch.randn(2, 3, 8, 8)
    proto = _export(model, x, opset_version=opset)
    assert proto.opset_import[0].version == opset
    graph = npuforge.import_onnx(proto)
    got = graph.run({"images": x.numpy()})["out"]
    with torch.no_grad():
        ref = model(x).numpy()
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"images": x.numpy()})[0]
    assert got.shape == ref.shape == (2, 5)
    assert np.abs(got - ref).max() <= 1e-5 and np.abs(got - theirs).max() <= 1e-5


class DynamicNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        y = torch.nn.functional.interpolate(torch.relu(self.conv(x)), scale_factor=2.0, mode="nearest")
        return torch.nn.functional.avg_pool2d(y, 2)


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory):
    torch.manual_seed(0)
    model = DynamicNet().eval()
    path = tmp_path_factory.mktemp("dyn") / "dyn.onnx"
    proto = _export(model, torch.randn(1, 3, 32, 32), opset_version=17,
                    dynamic_axes={"images": {0: "N", 2: "H", 3: "W"}})
    onnx.save(proto, path)
    return model, path


def test_dynamic_spatial_sizes_need_input_shape(dynamic_model):
    model, path = dynamic_model
    with pytest.raises(NpuforgeError, match=r"must be static here; fix .* with --input-shape NAME=D0,D1,\.\.\. \(one size per dim"):
        npuforge.load(path)
    graph = npuforge.load(path, input_shapes={"images": ("N", 3, 40, 24)})
    assert graph.values["images"].shape == ("N", 3, 40, 24) and graph.values["out"].shape == ("N", 4, 20, 12)
    x = torch.randn(3, 3, 40, 24)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(graph.run({"images": x.numpy()})["out"] - ref).max() <= 1e-5


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_input_shape_option_on_the_cli(dynamic_model, capsys, tmp_path):
    _, path = dynamic_model
    code, out, _ = _cli(capsys, "inspect", path, "--input-shape", "images=1,3,32,48", "--json")
    assert code == 0
    assert json.loads(out)["outputs"] == [{"name": "out", "dtype": "float32", "shape": [1, 4, 16, 24]}]
    code, out, _ = _cli(capsys, "check", path, "--input-shape", "N,3,64,64")  # NAME= left out: the one input
    assert code == 0 and "ok" in out
    out_ir = tmp_path / "o.nfir"
    code, _, _ = _cli(capsys, "optimize", path, "--input-shape", "images=2,3,16,16", "--output", out_ir)
    assert code == 0 and npuforge.load(out_ir).values["images"].shape == (2, 3, 16, 16)


@pytest.mark.parametrize("spec, fragment", [
    ("pictures=1,3,32,32", "names 'pictures', which is not a graph input; inputs: images"),
    ("images=1,3,32", "gives 3 dims but the input has rank 4"),
    ("images=1,4,32,32", "dim 1 is fixed at 3 in the model, not 4"),
    ("images=1,3,,32", "write NAME=D1,D2,... with positive sizes"),
    ("images=1,3,0,32", "write NAME=D1,D2,... with positive sizes"),
])
def test_input_shape_errors_are_one_line(dynamic_model, capsys, spec, fragment):
    _, path = dynamic_model
    code, _, err = _cli(capsys, "inspect", path, "--input-shape", spec)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("npuforge: error: ") and fragment in lines[0], err


def test_input_shape_refused_for_saved_ir_and_zoo_models(dynamic_model, capsys, tmp_path):
    _, path = dynamic_model
    ir = tmp_path / "d.nfir"
    npuforge.save(npuforge.load(path, input_shapes={"images": (1, 3, 8, 8)}), ir)
    code, _, err = _cli(capsys, "inspect", ir, "--input-shape", "images=1,3,8,8")
    assert code == 2 and "--input-shape is for ONNX files" in err
    code, _, err = _cli(capsys, "eval", "resnet18", "--data", tmp_path, "--input-shape", "1,3,8,8")
    assert code == 2 and "zoo models have static input shapes" in err


# -- dims stored as -1 / 0, If and Loop decided at import --------------------------------------------------

from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feeds) -> list:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _assert_matches_ort(model, graph, feeds):
    ours = graph.run(feeds)
    for name, ref in zip(graph.outputs, _ort(model, feeds)):
        assert ours[name].shape == ref.shape and np.abs(ours[name] - ref).max() <= 1e-5 * max(1, np.abs(ref).max())


def test_dims_stored_as_minus_one_or_zero_are_dynamic(tmp_path, capsys):
    """Several exporters mark a dynamic batch as -1 (or 0): a symbol, fixable with --input-shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 0, 8])
    scale = helper.make_node("Mul", ["x", "w"], ["y"])
    model = _model([scale], [x], ["y"], {"w": np.float32([2, -1, 0.5]).reshape(1, 3, 1, 1)})
    path = tmp_path / "minus_one.onnx"
    onnx.save(model, path)
    assert npuforge.load(path).values["x"].shape == ("x_dim0", 3, "x_dim2", 8)
    graph = npuforge.load(path, input_shapes={"x": (-1, 3, 48, 8)})  # -1: as the model has it (dynamic)
    assert graph.values["x"].shape == ("x_dim0", 3, 48, 8) and graph.values["y"].shape == ("x_dim0", 3, 48, 8)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 48, 8), np.float32)}
    dynamic = onnx.ModelProto()
    dynamic.CopyFrom(model)  # ONNX Runtime reads a stored 0 as a fixed 0: name the dims for it
    for k, d in enumerate(dynamic.graph.input[0].type.tensor_type.shape.dim):
        if d.dim_value <= 0:
            d.dim_param = f"d{k}"
    _assert_matches_ort(dynamic, graph, feeds)
    code, out, err = _cli(capsys, "inspect", path, "--input-shape", "x=1,3,48,8", "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["shape"] == [1, 3, 48, 8]
    code, out, _ = _cli(capsys, "inspect", path, "--input-shape", "x=-1,-1,16,-1", "--json")
    assert code == 0 and json.loads(out)["inputs"][0]["shape"] == ["x_dim0", 3, 16, 8]
    for spec, fragment in [("x=1,3,-2,8", "with positive sizes, -1 to keep the model's dim"),
                           ("x=1,4,48,8", "dim 1 is fixed at 3 in the model, not 4")]:
        code, _, err = _cli(capsys, "inspect", path, "--input-shape", spec)
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
    with pytest.raises(NpuforgeError, match=r"dim 2 is 0; give a positive size, -1 to keep the model's dim"):
        npuforge.load(path, input_shapes={"x": (1, 3, 0, 8)})


def _branch(name, nodes, output, inits=()):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                             [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])


def _if_on_height(threshold: int = 32) -> onnx.ModelProto:
    """y = x * 2 + 1 where the height exceeds ``threshold``, else -x or a constant (the branch's own
    initializer) through a nested If on the width: the input's shape decides both."""
    then = _branch("then", [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y_t"])],
                   "y_t", {"two": np.float32(2)})
    inner_then = _branch("inner_then", [helper.make_node("Neg", ["x"], ["n"])], "n")
    inner_else = _branch("inner_else", [], "c", {"c": np.float32([0.5, -1.5])})  # an initializer of the branch
    els = _branch("else", [helper.make_node("Shape", ["x"], ["s2"]),
                           helper.make_node("Gather", ["s2", "three"], ["w"], axis=0),
                           helper.make_node("Less", ["w", "wide"], ["narrow"]),
                           helper.make_node("If", ["narrow"], ["y_e"], then_branch=inner_then,
                                            else_branch=inner_else, name="inner")], "y_e")
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "two_i"], ["h"], axis=0),
             helper.make_node("Greater", ["h", "limit"], ["tall"]),
             helper.make_node("If", ["tall"], ["y"], then_branch=then, else_branch=els, name="by_height"),
             helper.make_node("Relu", ["y"], ["out"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])], ["out"],
                  {"two_i": np.int64(2), "three": np.int64(3), "limit": np.int64(threshold), "one": np.float32(1),
                   "wide": np.int64(16)})


@pytest.mark.parametrize("size, ops", [((40, 8), {"Mul": 1, "Add": 1, "Relu": 1}),
                                       ((24, 8), {"Neg": 1, "Relu": 1}),
                                       ((24, 20), {"Identity": 1, "Relu": 1})])
def test_if_with_a_condition_known_at_import_is_folded(size, ops):
    model = _if_on_height()
    graph = npuforge.import_onnx(model, input_shapes={"x": ("N", 3, *size)})
    assert graph.op_histogram() == ops  # the taken branch only; the condition's Shape / Gather / Greater dropped
    _assert_matches_ort(model, graph, {"x": np.random.default_rng(2).standard_normal((2, 3, *size), np.float32)})


def test_if_and_loop_undecided_at_import_are_one_line(tmp_path, capsys):
    path = tmp_path / "if.onnx"
    onnx.save(_if_on_height(), path)
    code, _, err = _cli(capsys, "inspect", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert ("node 'by_height' (If): its condition 'tall' is not known when the graph is imported: it depends on the "
            "dynamic size of the graph input 'x' ['N', 3, 'H', 'W']; fix it with --input-shape x=D,3,D,D") in err
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    by_value = _model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                       helper.make_node("Greater", ["s", "zero"], ["positive"]),
                       helper.make_node("If", ["positive"], ["y"], name="sign", then_branch=_branch(
                           "t", [helper.make_node("Neg", ["x"], ["n"])], "n"), else_branch=_branch("e", [], "x"))],
                      [x], ["y"], {"zero": np.float32(0)})
    # decided by the input's values: both branches and a Where (tests/test_if_select.py)
    signs = npuforge.import_onnx(by_value, name="m.onnx")
    assert [n.op for n in signs.nodes][-1] == "Where"
    for x_value in (np.ones((2, 3), np.float32), -np.ones((2, 3), np.float32)):
        np.testing.assert_array_equal(np.asarray(run_float(signs, {"x": x_value})["y"]), -np.abs(x_value))
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Neg", ["v"], ["v2"])],
                             "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                      helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                      helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info(n, t, None) for n, t in
                              (("c2", TensorProto.BOOL), ("v2", TensorProto.FLOAT))])
    counted = _model([helper.make_node("ArgMax", ["x"], ["k"], axis=1, keepdims=0),
                      helper.make_node("ReduceMax", ["k"], ["trips"], keepdims=0),
                      helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body, name="repeat")], [x], ["y"])
    with pytest.raises(NpuforgeError, match=r"node 'repeat' \(Loop\): its trip count 'trips' is not known .* "
                                            r"values of the graph input 'x'"):
        npuforge.import_onnx(counted, name="m.onnx")


def test_loop_with_a_known_trip_count_is_unrolled():
    """y <- y * 0.5 + x three times (x from the outer scope), a scan output y + i, and a condition the
    body computes: i < 2 stops it after the third iteration of five."""
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    body = helper.make_graph(
        [helper.make_node("Mul", ["y_in", "half"], ["m"]), helper.make_node("Add", ["m", "x"], ["y_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=f), helper.make_node("Add", ["y_out", "fi"], ["scan"]),
         helper.make_node("Less", ["i", "two"], ["again"])], "body",
        [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("c", b, []),
         helper.make_tensor_value_info("y_in", f, None)],
        [helper.make_tensor_value_info("again", b, []), helper.make_tensor_value_info("y_out", f, None),
         helper.make_tensor_value_info("scan", f, None)],
        [numpy_helper.from_array(np.float32(0.5), "half"), numpy_helper.from_array(np.int64(2), "two")])
    model = _model([helper.make_node("Loop", ["five", "yes", "x"], ["y", "ys"], body=body, name="loop")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], ["y", "ys"],
                   {"five": np.int64(5), "yes": np.bool_(True)})
    graph = npuforge.import_onnx(model)
    assert graph.values["ys"].shape == (3, 2, 3) and "Loop" not in graph.op_histogram()
    assert graph.op_histogram()["Mul"] == 3
    _assert_matches_ort(model, graph, {"x": np.random.default_rng(3).standard_normal((2, 3), np.float32)})


def test_gather_of_a_known_index_out_of_range_is_one_line():
    """(Found by mutating the If models above: the shape arithmetic's np.take raised IndexError.)"""
    model = _model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "seven"], ["d"]),
                    helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], ["y"], {"seven": np.int64(7)})
    with pytest.raises(NpuforgeError, match=r"node 'Gather_1' \(Gather\): index 7 is out of range for axis 0 of size 4"):
        npuforge.import_onnx(model, name="m.onnx")
