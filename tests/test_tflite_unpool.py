"""MediaPipe's MaxPoolingWithArgmax2D and MaxUnpooling2D (window-local indices) imported as
MaxPoolWindowArgmax and MaxUnpoolWindow, against MediaPipe's own runtime.

The reference: MediaPipe 0.10.14's InferenceCalculator with its custom-op resolver, run once by
scripts/make_mediapipe_custom_fixtures.py on three image -> pool -> unpool models
(tests/data/mediapipe_custom: 2x2 stride 2 SAME on 24x24, 3x3 stride 2 SAME on 23x23 with
overlapping windows, 3x3 stride 3 VALID on 23x23) and five images each (noise with equal values
in a window, a ramp); its outputs are stored beside the models.
"""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import numpy as np
import pytest

import npuforge
from npuforge.errors import ModelFormatError, UnsupportedError
from npuforge.frontend.tflite_importer import import_tflite
from npuforge.quant.quantize import quantize
from npuforge.sim.integer import IntegerSimulator

schema = pytest.importorskip("ai_edge_litert.schema_py_generated", reason="LiteRT's schema is not installed")

DATA = Path(__file__).parent / "data" / "mediapipe_custom"
MODELS = {"pool2": 24, "pool3_odd": 23, "pool3_valid": 23}


def reference(name: str) -> tuple:
    ref = np.load(DATA / f"{name}.npz")
    size = MODELS[name]
    return ref["input"].reshape(-1, size, size, 3).transpose(0, 3, 1, 2), [ref["output0"], ref["output1"]]


@pytest.mark.parametrize("name", MODELS)
def test_pool_and_unpool_equal_mediapipe_bit_for_bit(name):
    g = import_tflite(DATA / f"{name}.tflite")
    assert [n.op for n in g.nodes] == ["MaxPoolWindowArgmax", "MaxUnpoolWindow"]
    images, refs = reference(name)
    for k in range(len(images)):
        out = g.run({g.inputs[0]: images[k:k + 1]})
        for o, want in zip(g.outputs, refs):
            got = np.asarray(out[o]).transpose(0, 2, 3, 1).reshape(-1)
            assert np.array_equal(got, want[k]), (name, k, o)


def test_integer_program_moves_codes_and_fills_the_zero_point():
    """int8: the pooled codes are the input's, the unpooled places without a value hold the zero
    point (an input range around 0 puts it mid-grid): on inputs already on the input's grid the
    integer program equals the float model exactly, empty places 0.0."""
    g = npuforge.load(DATA / "pool3_odd.tflite")
    images, _ = reference("pool3_odd")
    feeds = [{g.inputs[0]: x[None] - np.float32(0.5)} for x in images]
    q = quantize(g, feeds)
    assert 100 < int(q.values[q.outputs[1]].quant.zero_point) < 156
    sim = IntegerSimulator(q)
    xq = q.values[q.inputs[0]].quant
    for f in feeds:
        on_grid = {g.inputs[0]: xq.dequantize(xq.quantize(f[g.inputs[0]])).astype(np.float32)}
        got, want = sim.run(on_grid), g.run(on_grid)
        for o in q.outputs:
            assert np.array_equal(np.asarray(got[o]), np.asarray(want[o])), o
    with pytest.raises(UnsupportedError, match="window-local indices have no ONNX form"):
        npuforge.export.to_onnx(g)


def _variant(name: str, edit) -> bytes:
    m = schema.ModelT.InitFromPackedBuf((DATA / f"{name}.tflite").read_bytes(), 0)
    edit(m)
    b = flatbuffers.Builder(4096)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def test_indices_read_elsewhere_are_refused():
    def indices_out(m):
        sg = m.subgraphs[0]
        sg.outputs = list(sg.outputs) + [sg.operators[0].outputs[1]]

    with pytest.raises(UnsupportedError, match="indices read by another operator than MaxUnpooling2D") as e:
        import_tflite(_variant("pool2", indices_out))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("edit,error,match", [
    (lambda op: setattr(op, "customOptions", op.customOptions[:12]), ModelFormatError, "12 bytes of custom options"),
    (lambda op: setattr(op, "customOptions", [9] + list(op.customOptions[1:])), ModelFormatError, "padding code 9"),
    (lambda op: setattr(op, "customOptions", list(op.customOptions[:20]) + [1, 0, 0, 0] +
                        list(op.customOptions[24:])), UnsupportedError, "fused activation 1"),
])
def test_bad_options(edit, error, match):
    def change(m):
        edit(m.subgraphs[0].operators[0])

    with pytest.raises(error, match=match) as e:
        import_tflite(_variant("pool2", change))
    assert "\n" not in str(e.value)
