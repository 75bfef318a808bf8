"""MediaPipe's attention-mesh custom ops (Landmarks2TransformMatrix, TransformTensorBilinear,
TransformLandmarks, version 2) imported as npuforge's geometry ops, against MediaPipe's own runtime.

LiteRT has no kernels for them, so the reference is MediaPipe 0.10.14's InferenceCalculator with
its custom-op resolver, run once by scripts/make_mediapipe_custom_fixtures.py on two small models
(tests/data/mediapipe_custom: a 24x24 image read as 576 landmarks, a crop matrix from a subset,
the image cropped by it into 8x8 and 6x10, the landmarks mapped by it) and five images; its outputs
are stored beside the models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import npuforge
from npuforge.errors import ModelFormatError
from npuforge.frontend.tflite_importer import import_tflite
from npuforge.quant.quantize import make_plan, quantize
from npuforge.quant.config import QuantConfig
from npuforge.sim.lowered import make_simulator

pytest.importorskip("ai_edge_litert", reason="LiteRT's schema (ai-edge-litert) is not installed")

DATA = Path(__file__).parent / "data" / "mediapipe_custom"
MODELS = ("eye", "tilted")
OPS = {"LandmarksToTransformMatrix", "TransformTensorBilinear", "TransformLandmarks"}


def reference(name: str) -> tuple:
    ref = np.load(DATA / f"{name}.npz")
    images = ref["input"].reshape(-1, 24, 24, 3).transpose(0, 3, 1, 2)  # MediaPipe's input tensors, NCHW
    return images, [ref[f"output{i}"] for i in range(4)]


def as_file_layout(y: np.ndarray) -> np.ndarray:
    return y.transpose(0, 2, 3, 1) if y.ndim == 4 else y  # the crop back to NHWC


@pytest.mark.parametrize("name", MODELS)
def test_outputs_equal_mediapipe(name):
    """Every output of every image within float32 rounding of MediaPipe's (atan2, cos and sin of
    another library): the matrix, the crop (its outside-the-image zeros exactly where MediaPipe's
    are) and both landmark maps."""
    g = import_tflite(DATA / f"{name}.tflite")
    assert OPS <= {n.op for n in g.nodes}
    images, refs = reference(name)
    for k in range(len(images)):
        out = g.run({g.inputs[0]: images[k:k + 1]})
        for o, want in zip(g.outputs, refs):
            got = as_file_layout(np.asarray(out[o])).reshape(-1)
            scale = np.abs(want[k]).max()
            np.testing.assert_allclose(got, want[k], rtol=0, atol=1e-5 * scale + 1e-7, err_msg=f"{name} {k} {o}")
        crop = as_file_layout(np.asarray(out[g.outputs[1]])).reshape(-1)
        assert np.array_equal(crop == 0, refs[1][k] == 0)
    assert any((r == 0).sum() > 50 for r in refs[1])  # crops that run off the image are covered


def test_onnx_export_runs_in_onnx_runtime():
    """The ops' standard-ONNX forms (GridSample for the crop, no atan2 for the rotation) in ONNX
    Runtime, within float32 rounding of MediaPipe's outputs, the crop's zeros where MediaPipe's are."""
    import onnxruntime as ort

    for name in MODELS:
        g = import_tflite(DATA / f"{name}.tflite")
        session = ort.InferenceSession(npuforge.export.to_onnx(g).SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        images, refs = reference(name)
        for k in range(len(images)):
            for i, got in enumerate(session.run(None, {g.inputs[0]: images[k:k + 1]})):
                got, want = as_file_layout(got).reshape(-1), refs[i][k]
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * (1 + np.abs(want).max()) + 5e-5,
                                           err_msg=f"{name} {k} output {i}")
                if i == 1:
                    assert np.array_equal(got == 0, want == 0)


def test_quantized_keeps_geometry_in_float_and_runs():
    """The quantizer keeps the three ops in float with their reason; the integer simulator runs the
    program within a few output steps of float, lowered up to the first of them and on the plain
    path from there (auto: nodes in float are not lowered) and on the fast engine (their ONNX forms)."""
    g = npuforge.load(DATA / "eye.tflite")
    plan = make_plan(g, QuantConfig())
    reasons = {n.op: r for n, r in plan.kept_float}
    assert set(reasons) == OPS and all("data-dependent geometry" in r for r in reasons.values())
    images, _ = reference("eye")
    q = quantize(g, [{g.inputs[0]: images[k:k + 1]} for k in range(len(images))])
    x = images[4:5]
    want = np.asarray(g.run({g.inputs[0]: x})[g.outputs[3]])
    for engine in ("auto", "fast"):
        sim = make_simulator(q, "fixedpoint", engine)
        assert getattr(sim, "fallback", None) is None
        # auto: lowered up to the first geometry node, the plain simulator from there on
        assert type(sim).__name__ == ("SplitSimulator" if engine == "auto" else "LoweredSimulator")
        assert engine == "fast" or "it runs in float" in sim.plain_from
        got = np.asarray(sim.run({q.inputs[0]: x})[q.outputs[3]])
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_fast_engine_lowers_a_float_op_whose_quantized_output_feeds_an_integer_node():
    """A geometry op's output that an integer node reads is quantized after the op: the op's ONNX form
    ends in a node named after that output, and the fast engine's quantizer of it must not take the
    same name (ONNX Runtime refused the graph, so the face landmark model with attention ran on the
    plain path). Lowered, it gives the plain path's codes on these images."""
    from npuforge.ir.graph import Node, Value
    from npuforge.ir.infer import infer_shapes
    from npuforge.sim.integer import IntegerSimulator
    from npuforge.sim.lowered import LoweredSimulator

    g = npuforge.load(DATA / "eye.tflite")
    g.add_const("two", np.float32(2.0))
    g.add_value(Value("matrix2", "float32", None))
    g.nodes.append(Node("double_matrix", "Mul", ["matrix", "two"], ["matrix2"]))
    g.outputs.append("matrix2")
    infer_shapes(g)
    images, _ = reference("eye")
    q = quantize(g, [{g.inputs[0]: images[k:k + 1]} for k in range(len(images))])
    assert q.values["matrix"].quant is not None
    fast = make_simulator(q, "fixedpoint", "fast")
    assert isinstance(fast, LoweredSimulator), getattr(fast, "fallback", None)
    plain = IntegerSimulator(q)
    for k in range(len(images)):
        feeds = {q.inputs[0]: images[k:k + 1]}
        got, want = fast.run(feeds, dequantize=False), plain.run(feeds, dequantize=False)
        assert np.array_equal(got["matrix2"], want["matrix2"]), k


def test_quantize_cli_keeps_the_ir_when_the_qdq_export_fails(tmp_path, capsys, monkeypatch):
    """A QDQ export that fails (an op with no ONNX form) costs the QDQ file only: the IR and its
    weights are written, an older QDQ file of that name is removed, and calibration runs on
    npuforge's executor when ONNX Runtime cannot take the float graph."""
    import npuforge.export
    from npuforge.cli import main
    from npuforge.errors import UnsupportedError

    def refuse(graph):
        raise UnsupportedError("node 'x' (Op): no ONNX form")

    monkeypatch.setattr(npuforge.export, "to_onnx", refuse)
    monkeypatch.setattr(npuforge.export, "to_qdq_onnx", refuse)
    calib = tmp_path / "calib"
    calib.mkdir()
    images, _ = reference("eye")
    for k, x in enumerate(images):
        np.save(calib / f"{k}.npy", x[None])
    stale = tmp_path / "q.onnx"
    stale.write_bytes(b"another model's QDQ file")
    out = tmp_path / "q.nfir"
    assert main(["quantize", str(DATA / "eye.tflite"), "--calib", str(calib), "--num-calib", "5", "-o", str(out),
                 "--force"]) == 0
    assert "no QDQ file: node 'x' (Op): no ONNX form" in capsys.readouterr().out
    assert out.exists() and out.with_suffix(".safetensors").exists() and not stale.exists()


def _patched(name: str, old: bytes, new: bytes) -> bytes:
    buf = (DATA / f"{name}.tflite").read_bytes()
    assert buf.count(old) == 1
    return buf.replace(old, new)


@pytest.mark.parametrize("old,new,error,match", [
    (b"subset_idxs", b"subset_idxz", ModelFormatError, "no usable 'subset_idxs'"),
    (b"output_height\x00output_width\x00\x02", b"output_height\x00output_widtx\x00\x02", ModelFormatError,
     "no usable 'output_width'"),
])
def test_bad_options_are_one_line_errors(old, new, error, match):
    with pytest.raises(error, match=match) as e:
        import_tflite(_patched("eye", old, new))
    assert "\n" not in str(e.value)


def test_compiled_program_runs_geometry_on_the_host(tmp_path):
    """``compile`` puts the three ops in host-CPU commands; ``npuforge run`` of the program gives the
    integer simulator's outputs exactly, float outputs included (they pass the CLI's dequantization
    unchanged: scale 1, zero point 0)."""
    from npuforge.cli import main

    g = npuforge.load(DATA / "eye.tflite")
    images, _ = reference("eye")
    q = quantize(g, [{g.inputs[0]: images[k:k + 1]} for k in range(len(images))])
    npuforge.save(q, tmp_path / "q.nfir")
    np.save(tmp_path / "x.npy", images[2:3])
    assert main(["compile", str(tmp_path / "q.nfir"), "-o", str(tmp_path / "q.npub")]) == 0
    assert main(["run", str(tmp_path / "q.npub"), "--input", f"image={tmp_path / 'x.npy'}", "--output",
                 str(tmp_path / "p.npz")]) == 0
    assert main(["run", str(tmp_path / "q.nfir"), "--mode", "int", "--input", f"image={tmp_path / 'x.npy'}",
                 "--output", str(tmp_path / "s.npz")]) == 0
    program, sim = np.load(tmp_path / "p.npz"), np.load(tmp_path / "s.npz")
    assert sorted(program.files) == sorted(sim.files) == sorted(q.outputs)
    for name in q.outputs:
        assert np.array_equal(program[name], sim[name]), name
