"""The npuforge command: outputs and user errors (one line, exit 2, no traceback)."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npuforge.cli import main
from onnx_builders import one_node_model


@pytest.fixture
def conv_model(tmp_path):
    model, _ = one_node_model("Conv", [("x", np.ones((1, 3, 8, 8), np.float32)),
                                       ("w", np.ones((4, 3, 3, 3), np.float32))], {"pads": [1, 1, 1, 1]},
                              consts={"w"})
    path = tmp_path / "conv.onnx"
    onnx.save(model, path)
    return path


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npuforge: error: "), err
    for f in fragments:
        assert f in lines[0], lines[0]


def test_inspect_json(capsys, conv_model):
    code, out, _ = run_cli(capsys, "inspect", conv_model, "--json")
    assert code == 0
    info = json.loads(out)
    assert info["ops"] == {"Conv": 1}
    assert info["parameters"] == 4 * 3 * 3 * 3
    assert info["macs"] == 4 * 8 * 8 * 3 * 3 * 3
    assert info["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]


def test_inspect_table(capsys, conv_model):
    code, out, _ = run_cli(capsys, "inspect", conv_model)
    assert code == 0 and "Conv" in out and "MACs" in out and "x: float32[1,3,8,8]" in out


def test_check_ok(capsys, conv_model):
    code, out, _ = run_cli(capsys, "check", conv_model)
    assert code == 0 and "ok (1 nodes" in out


def test_check_reports_problems_of_a_saved_ir(capsys, tmp_path, conv_model):
    import npuforge

    npuforge.save(npuforge.load(conv_model), tmp_path / "m.nfir")
    text = (tmp_path / "m.nfir").read_text().replace("y0: float32[1,4,8,8]", "y0: float32[1,4,8,9]")
    (tmp_path / "m.nfir").write_text(text)
    code, out, _ = run_cli(capsys, "check", tmp_path / "m.nfir")
    assert code == 1
    assert "node 'the_node' (Conv): output 'y0' is recorded as float32[1,4,8,9]" in out


def test_run_writes_outputs(capsys, tmp_path, conv_model):
    np.save(tmp_path / "x.npy", np.ones((1, 3, 8, 8), np.float32))
    code, out, _ = run_cli(capsys, "run", conv_model, "--input", f"x={tmp_path / 'x.npy'}",
                           "--output", tmp_path / "out.npz")
    assert code == 0
    y = np.load(tmp_path / "out.npz")["y0"]
    assert y.shape == (1, 4, 8, 8) and y[0, 0, 3, 3] == 27


def test_ops_lists_registry(capsys):
    code, out, _ = run_cli(capsys, "ops")
    assert code == 0 and "ConvTranspose" in out and "Resize" in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:-1]}
    assert rows["Conv"] == "compute" and rows["Concat"] == "concat" and rows["Sigmoid"] == "lut"
    assert rows["MaxPool"] == "passthrough" and rows["Softmax"] == "softmax" and rows["TopK"] == "float"
    code, out, _ = run_cli(capsys, "ops", "--json")
    ops = json.loads(out)
    assert ops["Conv"]["quant"] == "compute" and ops["TopK"]["quant"] is None


def test_corrupt_onnx(capsys, tmp_path):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf at all \xff\xfe" * 10)
    code, _, err = run_cli(capsys, "inspect", bad)
    assert_user_error(code, err, str(bad), "corrupt")


def test_truncated_onnx(capsys, tmp_path, conv_model):
    data = conv_model.read_bytes()
    for cut in (len(data) // 3, len(data) - 7):
        trunc = tmp_path / f"trunc{cut}.onnx"
        trunc.write_bytes(data[:cut])
        code, _, err = run_cli(capsys, "check", trunc)
        assert_user_error(code, err, str(trunc))


def test_missing_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "inspect", tmp_path / "nope.onnx")
    assert_user_error(code, err, "nope.onnx", "no such file")


def test_unsupported_op(capsys, tmp_path):
    node = helper.make_node("Unique", ["a"], ["c"], name="mix")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [None])])
    path = tmp_path / "unique.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code, _, err = run_cli(capsys, "inspect", path)
    assert_user_error(code, err, "node 'mix' (Unique)", "op 'Unique' is not supported", "`npuforge ops` lists")
    assert len(err) < 300 and "Conv" not in err  # the op list is `npuforge ops`, not the message
    code, out, _ = run_cli(capsys, "ops")
    assert code == 0 and "Unique" not in out and "Conv" in out


def test_unsupported_attribute_value(capsys, tmp_path):
    model, _ = one_node_model("Resize", [("x", np.ones((1, 1, 4, 4), np.float32)), ("roi", None),
                                         ("scales", np.array([1, 1, 2, 2], np.float32))],
                              {"coordinate_transformation_mode": "tf_crop_and_resize"}, consts={"scales"})
    onnx.save(model, tmp_path / "crop.onnx")
    code, _, err = run_cli(capsys, "check", tmp_path / "crop.onnx")
    assert_user_error(code, err, "node 'the_node' (Resize)", "coordinate_transformation_mode 'tf_crop_and_resize'")


def test_unsupported_opset(capsys, tmp_path):
    model, _ = one_node_model("Relu", [("x", np.ones((2,), np.float32))], opset=8)
    onnx.save(model, tmp_path / "old.onnx")
    code, _, err = run_cli(capsys, "inspect", tmp_path / "old.onnx")
    assert_user_error(code, err, "opset 8 is not supported (opsets 9 to 21)", "opset_version")


def test_missing_external_data(capsys, tmp_path):
    from onnx.external_data_helper import convert_model_to_external_data

    model, _ = one_node_model("Conv", [("x", np.ones((1, 3, 8, 8), np.float32)),
                                       ("w", np.ones((64, 3, 3, 3), np.float32))], consts={"w"})
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save(model, tmp_path / "ext.onnx")
    (tmp_path / "weights.bin").unlink()
    code, _, err = run_cli(capsys, "inspect", tmp_path / "ext.onnx")
    assert_user_error(code, err, "initializer 'w'", "weights.bin", "missing")


def test_wrong_input_shape_keeps_existing_output(capsys, tmp_path, conv_model):
    np.save(tmp_path / "x.npy", np.ones((1, 3, 9, 8), np.float32))
    np.savez(tmp_path / "out.npz", y=np.arange(3))  # an earlier run's outputs
    precious = (tmp_path / "out.npz").read_bytes()
    code, _, err = run_cli(capsys, "run", conv_model, "--input", f"x={tmp_path / 'x.npy'}",
                           "--output", tmp_path / "out.npz")
    assert_user_error(code, err, "input 'x' has shape [1, 3, 9, 8], expected [1,3,8,8]")
    assert (tmp_path / "out.npz").read_bytes() == precious


def test_unreadable_input_file(capsys, tmp_path, conv_model):
    (tmp_path / "x.npy").write_text("not numpy")
    code, _, err = run_cli(capsys, "run", conv_model, "--input", str(tmp_path / "x.npy"))
    assert_user_error(code, err, "cannot read", "x.npy")


def test_console_script_exit_code_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk")
    proc = subprocess.run([sys.executable, "-m", "npuforge.cli", "inspect", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("npuforge: error: ")


GOOD_PREPROCESS = {"resize_size": 9, "crop_size": [8, 8], "interpolation": "bilinear", "mean": [0, 0, 0],
                   "std": [1, 1, 1]}


@pytest.mark.parametrize("meta, fragment", [
    ({"preprocess": 5}, "'preprocess' is a JSON int"),
    ({"preprocess": {**GOOD_PREPROCESS, "crop_size": "a"}}, "crop_size 'a'"),
    ({"preprocess": {**GOOD_PREPROCESS, "crop_size": [1 << 20, 1 << 20]}}, "at most 67108864 pixels"),
    ({"preprocess": {**GOOD_PREPROCESS, "resize_size": -3}}, "resize_size -3"),
    ({"preprocess": {**GOOD_PREPROCESS, "interpolation": None}}, "interpolation None"),
    ({"preprocess": {**GOOD_PREPROCESS, "std": [1, 0, 1]}}, "std [1, 0, 1]"),
    ({"preprocess": GOOD_PREPROCESS, "class_table": 7}, "class_table is not two equal lists"),
    ({"preprocess": GOOD_PREPROCESS, "class_table": {"wnids": ["a"], "names": []}}, "class_table"),
])
def test_a_malformed_metadata_record_is_one_line(capsys, tmp_path, conv_model, meta, fragment):
    """A saved IR's metadata is read from a file: its preprocessing and class table are checked
    before an image is resized to them (they were AttributeError / KeyError / MemoryError)."""
    import npuforge
    from PIL import Image

    graph = npuforge.load(conv_model)
    graph.metadata.update(meta)
    npuforge.save(graph, tmp_path / "m.nfir")
    (tmp_path / "images" / "a").mkdir(parents=True)
    Image.new("RGB", (10, 12)).save(tmp_path / "images" / "a" / "0.png")
    code, _, err = run_cli(capsys, "eval", tmp_path / "m.nfir", "--data", tmp_path / "images", "--batch-size", 1)
    assert_user_error(code, err, "m.nfir", fragment)


def test_malformed_npuforge_metadata_in_an_onnx_file(capsys, tmp_path, conv_model):
    model = onnx.load(conv_model)
    model.metadata_props.add(key="npuforge", value="[not json")
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "images" / "a").mkdir(parents=True)
    code, _, err = run_cli(capsys, "eval", tmp_path / "m.onnx", "--data", tmp_path / "images", "--engine", "ort")
    assert_user_error(code, err, "m.onnx", "'npuforge' metadata is not a JSON object")
