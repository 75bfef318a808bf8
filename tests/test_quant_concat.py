"""A Concat of inputs with very different ranges (a detector head's boxes and
scores): found from the calibrated ranges, warned about, quantized in int16."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import npuforge
from npuforge.errors import NpuforgeError
from npuforge.export import to_qdq_onnx
from npuforge.quant.config import QuantConfig
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.integer import IntegerSimulator


class DetectorHead(torch.nn.Module):
    """Boxes in pixels (about 0-300) concatenated with sigmoid scores (0-1), as YOLO's head does."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.box = torch.nn.Conv2d(8, 4, 1)
        self.cls = torch.nn.Conv2d(8, 3, 1)

    def forward(self, x):
        f = torch.relu(self.stem(x))
        boxes = torch.relu(self.box(f)) * 100.0
        scores = torch.sigmoid(self.cls(f))
        return torch.cat([boxes, scores], 1)


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(0)
    graph = npuforge.from_torch(DetectorHead().eval(), torch.zeros(1, 3, 8, 8))
    rng = np.random.default_rng(0)
    calib = [rng.standard_normal((8, 3, 8, 8)).astype(np.float32) for _ in range(2)]
    return graph, calib


def _score_error(graph, q, x) -> float:
    ref = graph.run({graph.inputs[0]: x})[graph.outputs[0]]
    got = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    return float(np.abs(got[:, 4:] - ref[:, 4:]).max())


def test_mismatched_concat_is_found_warned_and_quantized_in_int16(head):
    graph, calib = head
    messages = []
    q = npuforge.quantize(graph, calib, log=messages.append)
    concat = next(n for n in q.nodes if n.op == "Concat")
    warned = [m for m in messages if f"node '{concat.name}' (Concat): input ranges differ" in m]
    assert len(warned) == 1 and "quantized in int16" in warned[0] and "codes" in warned[0], messages
    assert q.values[concat.outputs[0]].quant.dtype == "int16"
    assert all(q.values[i].quant.dtype == "int16" for i in concat.inputs)
    (report,) = q.metadata["quantization"]["int16_concats"]
    assert report["node"] == concat.name and report["ratio"] > 16 and report["codes"] < 16
    err16 = _score_error(graph, q, calib[0])
    assert err16 < 0.01  # scores keep their resolution

    # the same model with one shared 8-bit grid: the scores fall onto a few codes of the boxes' step
    q8 = npuforge.quantize(graph, calib, {"concat_range_ratio": 0}, log=messages.append)
    p8 = q8.values[concat.outputs[0]].quant
    assert p8.dtype == "uint8" and not q8.metadata["quantization"]["int16_concats"]
    err8 = _score_error(graph, q8, calib[0])
    assert err8 > 0.25 * float(p8.scale) and err8 > 20 * err16, (err8, err16, float(p8.scale))


def test_int16_concat_runs_in_integers_and_in_onnx_runtime(head):
    graph, calib = head
    q = npuforge.quantize(graph, calib, log=lambda m: None)
    x = calib[1]
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    step = float(q.values[q.outputs[0]].quant.scale)
    integer = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(integer - fake).max() <= 2 * step
    options = ort.SessionOptions()  # the QDQ file's float arithmetic: ORT's fused int8 kernels saturate
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # on x86 without VNNI
    sess = ort.InferenceSession(to_qdq_onnx(q).SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert np.abs(sess.run(None, {q.inputs[0]: x})[0] - fake).max() <= 2 * step


def test_concat_of_like_ranges_stays_8_bit():
    torch.manual_seed(0)
    graph = npuforge.from_torch(_Twins().eval(), torch.zeros(1, 3, 8, 8))
    calib = [np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32)]
    messages = []
    q = npuforge.quantize(graph, calib, log=messages.append)
    concat = next(n for n in q.nodes if n.op == "Concat")
    assert q.values[concat.outputs[0]].quant.dtype == "uint8" and not messages


class _Twins(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], 1)


@pytest.mark.parametrize("bad", [-1.0, 0.5])
def test_concat_range_ratio_is_checked(bad):
    with pytest.raises(NpuforgeError, match=f"concat_range_ratio={bad}: give 0"):
        QuantConfig(concat_range_ratio=bad)
