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
    with pytest.raises(NpuforgeError, match=r"must be static here; fix .* with --input-shape NAME=1,3,H,W"):
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
