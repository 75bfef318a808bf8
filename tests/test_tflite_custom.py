"""TFLite custom operators: MediaPipe's ``Convolution2DTransposeBias`` imported as the IR's
ConvTranspose with bias, and every other custom op refused in one line.

LiteRT has no kernel for the custom op, so each model is written twice: with builtin
TRANSPOSE_CONV (its own bias input, the output shape MediaPipe's kernel computes) for LiteRT
to run, and the same model with that operator rewritten as the custom op (inputs: input,
weights, bias; options: a TfLiteTransposeConvParams struct, three little-endian int32) for
npuforge to import. The rewrite goes through LiteRT's own schema object API. A numpy
transcription of the custom kernel's loop (bias everywhere, each input pixel scattered
through the filter, rows and columns cropped by the SAME padding's head) checks that the
two models are one computation.

The real MediaPipe selfie segmentation model (mediapipe 0.10.14's wheel, extracted as
benchmarks/real_models.py says; ``NPUFORGE_REAL_MODELS`` names the folder) is checked the
same way when it is present.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

litert = pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")

import npuforge  # noqa: E402
from ai_edge_litert import schema_py_generated as schema  # noqa: E402
from fuzz_harness import fuzz_cases, mutations, run_case  # noqa: E402
from npuforge.errors import ModelFormatError, NpuforgeError, UnsupportedError  # noqa: E402
from npuforge.export.litert_check import with_builtin_transpose_conv  # noqa: E402
from npuforge.export.tflite_writer import TensorQuant, TFLiteWriter  # noqa: E402
from npuforge.frontend.tflite_importer import import_tflite  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402
from tflite.BuiltinOperator import BuiltinOperator  # noqa: E402
from tflite.BuiltinOptions import BuiltinOptions  # noqa: E402

REF = litert.OpResolverType.BUILTIN_REF
NAME = b"Convolution2DTransposeBias"
SAME, VALID = 0, 1  # the schema's Padding (TRANSPOSE_CONV's options)
C_PADDING = {SAME: 1, VALID: 2}  # MediaPipe's options: TfLitePadding (1 SAME, 2 VALID)


def out_size(n: int, k: int, s: int, padding: int) -> int:
    """A spatial dim of the custom kernel's output: ``s * (n - 1) + k`` less its SAME padding."""
    return s * (n - 1) + k - (max(0, k - (n - 1) % s - 1) if padding == SAME else 0)


def builtin_model(x_shape, w, bias, padding, strides, then=None) -> bytes:
    """x (NHWC) -> TRANSPOSE_CONV (weights [O, KH, KW, I], bias) [-> ``then``: a unary builtin] -> y."""
    n, h, wd, _ = x_shape
    o, kh, kw, _ = w.shape
    shape = (n, out_size(h, kh, strides[0], padding), out_size(wd, kw, strides[1], padding), o)
    tw = TFLiteWriter()
    x = tw.tensor("x", x_shape, "float32")
    sizes = tw.tensor("output_shape", (4,), "int32", data=np.array(shape, np.int32))
    wt = tw.tensor("weights", w.shape, "float32", data=w)
    bt = tw.tensor("bias", bias.shape, "float32", data=bias)
    y = tw.tensor("up", shape, "float32")
    tw.operator(BuiltinOperator.TRANSPOSE_CONV, [sizes, wt, x, bt], [y], "TransposeConvOptions",
                BuiltinOptions.TransposeConvOptions, version=3, Padding=padding, StrideH=strides[0],
                StrideW=strides[1])
    if then is not None:
        z = tw.tensor("out", shape, "float32")
        tw.operator(getattr(BuiltinOperator, then), [y], [z])
        y = z
    return tw.finish([x], [y])


def as_custom(model: bytes, options: bytes | None = None, code: bytes = NAME, quant: bool = False) -> bytes:
    """``model`` with each TRANSPOSE_CONV rewritten as the custom op ``code``: inputs (input, weights,
    bias), ``options`` (default: MediaPipe's struct of the builtin's padding and strides) as its custom
    options. ``quant``: the graph input and output made int8 (an int8 model)."""
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    sg = m.subgraphs[0]
    custom = schema.OperatorCodeT()
    custom.builtinCode = custom.deprecatedBuiltinCode = BuiltinOperator.CUSTOM
    custom.customCode, custom.version = code, 1
    m.operatorCodes.append(custom)
    for op in sg.operators:
        if m.operatorCodes[op.opcodeIndex].builtinCode != BuiltinOperator.TRANSPOSE_CONV:
            continue
        opt = op.builtinOptions
        op.opcodeIndex = len(m.operatorCodes) - 1
        op.inputs = [op.inputs[2], op.inputs[1], op.inputs[3]]
        op.builtinOptionsType, op.builtinOptions = 0, None
        raw = struct.pack("<3i", C_PADDING[opt.padding], opt.strideW, opt.strideH) if options is None else options
        op.customOptions = list(raw)
    if quant:
        for t in (sg.inputs[0], sg.outputs[0]):
            tensor = sg.tensors[t]
            tensor.type = schema.TensorType.INT8
            tensor.quantization = schema.QuantizationParametersT()
            tensor.quantization.scale, tensor.quantization.zeroPoint = [0.05], [0]
    b = flatbuffers.Builder(len(model) + 1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def mediapipe_kernel(x, w, bias, padding, strides) -> np.ndarray:
    """The custom kernel's loop in numpy (NHWC): the output filled with the bias, then each input
    pixel's products added at ``in * stride - pad_head + filter offset`` where that lies inside."""
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    (sh, sw), heads = strides, []
    for size, k, s in ((h, kh, sh), (wd, kw, sw)):
        heads.append(max(0, k - (size - 1) % s - 1) // 2 if padding == SAME else 0)
    oh, ow = out_size(h, kh, sh, padding), out_size(wd, kw, sw, padding)
    y = np.broadcast_to(bias, (n, oh, ow, o)).astype(np.float64)
    for i in range(h):
        for j in range(wd):
            for fy in range(kh):
                for fx in range(kw):
                    r, c = i * sh - heads[0] + fy, j * sw - heads[1] + fx
                    if 0 <= r < oh and 0 <= c < ow:
                        y[:, r, c] += x[:, i, j].astype(np.float64) @ w[:, fy, fx].T.astype(np.float64)
    return y


def litert_run(model: bytes, x: np.ndarray, tensors=()) -> list:
    it = litert.Interpreter(model_content=model, experimental_op_resolver_type=REF,
                            experimental_preserve_all_tensors=bool(tensors))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(it.get_output_details()[0]["index"])] + [it.get_tensor(t) for t in tensors]


def nchw(a):
    return a.transpose(0, 3, 1, 2)


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# (input NHWC, kernel (KH, KW), strides (H, W), padding): odd and even sizes, kernels under, at and over
# the stride (SAME crops 0, an even or an odd number of rows: the odd one more at the end)
CASES = {
    "same_k2_s2": ((1, 8, 8, 3), (2, 2), (2, 2), SAME),  # the selfie model's head
    "same_k3_s2_odd": ((1, 5, 7, 3), (3, 3), (2, 2), SAME),
    "same_k4_s2_even": ((2, 6, 4, 2), (4, 4), (2, 2), SAME),
    "same_k3x5_s2x3": ((1, 4, 5, 3), (3, 5), (2, 3), SAME),
    "same_k1_s2": ((1, 3, 4, 2), (1, 1), (2, 2), SAME),
    "same_k3_s1": ((1, 5, 6, 4), (3, 3), (1, 1), SAME),
    "valid_k3_s2": ((1, 5, 6, 3), (3, 3), (2, 2), VALID),
    "valid_k2x3_s3x1": ((2, 3, 4, 2), (2, 3), (3, 1), VALID),
    "valid_k5_s2_one_pixel": ((1, 1, 1, 3), (5, 5), (2, 2), VALID),
}


def case_model(case, seed=0, out_channels=4, then=None):
    shape, (kh, kw), strides, padding = CASES[case]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_channels, kh, kw, shape[3])) * 0.5).astype(np.float32)
    bias = rng.standard_normal(out_channels).astype(np.float32)
    return builtin_model(shape, w, bias, padding, strides, then), (w, bias, padding, strides)


@pytest.mark.parametrize("case", CASES)
def test_custom_op_matches_litert_transpose_conv(case):
    builtin, (w, bias, padding, strides) = case_model(case)
    graph = import_tflite(as_custom(builtin), "custom")
    assert graph.op_histogram() == {"ConvTranspose": 1}
    node = graph.nodes[0]
    assert node.attrs["strides"] == list(strides) and len(node.inputs) == 3  # with its bias
    for seed in (0, 1):
        x = np.random.default_rng(seed).uniform(-1, 1, CASES[case][0]).astype(np.float32)
        ref = litert_run(builtin, x)[0]
        ours = graph.run({graph.inputs[0]: nchw(x)})[graph.outputs[0]]
        assert ours.shape == nchw(ref).shape
        assert rel(ours, nchw(ref)) < 1e-5
        # the two models are one computation: the custom kernel's loop gives LiteRT's result
        assert rel(mediapipe_kernel(x, w, bias, padding, strides), ref) < 1e-5


def test_custom_op_in_a_graph_quantizes():
    """Between other operators, as in the selfie model (a sigmoid after it): imported, quantized with
    nothing left in float, the integer simulator within a few output steps of the float run."""
    builtin, _ = case_model("same_k3_s2_odd", then="LOGISTIC")
    graph = import_tflite(as_custom(builtin), "m")
    assert graph.op_histogram() == {"ConvTranspose": 1, "Sigmoid": 1}
    x = np.random.default_rng(3).uniform(-1, 1, CASES["same_k3_s2_odd"][0]).astype(np.float32)
    np.testing.assert_allclose(graph.run({graph.inputs[0]: nchw(x)})[graph.outputs[0]],
                               nchw(litert_run(builtin, x)[0]), atol=1e-6)
    calib = [nchw(np.random.default_rng(s).uniform(-1, 1, x.shape).astype(np.float32)) for s in range(4)]
    q = npuforge.quantize(graph, calib, log=lambda m: None)
    assert not q.metadata["quantization"]["float_nodes"]
    want = graph.run({graph.inputs[0]: calib[0]})[graph.outputs[0]]
    got = IntegerSimulator(q).run({q.inputs[0]: calib[0]})[q.outputs[0]]
    assert np.abs(got - want).max() < 4 * float(q.values[q.outputs[0]].quant.scale)


# -- refusals: one line naming the operator -----------------------------------------------------------------

def test_other_custom_ops_are_refused_naming_op_and_node():
    builtin, _ = case_model("same_k2_s2")
    model = as_custom(builtin, code=b"Resampler")
    with pytest.raises(UnsupportedError, match=r"^m\.tflite: operator 0 \(output 'up'\) is the custom op "
                                               r"'Resampler', which npuforge does not import "
                                               r"\(`npuforge ops` lists the ops it reads; docs/tflite\.md the TFLite "
                                               r"operators and custom ops\)$"):
        import_tflite(model, "m.tflite")


@pytest.mark.parametrize("options, match", [
    (b"", r"0 bytes of custom options \(MediaPipe's TfLiteTransposeConvParams"),
    (struct.pack("<2i", 1, 2), r"8 bytes of custom options"),
    (struct.pack("<4i", 1, 2, 2, 0), r"16 bytes of custom options"),
    (struct.pack("<3i", 0, 2, 2), r"the padding code 0 in its custom options \(SAME is 1, VALID 2\)"),
    (struct.pack("<3i", 3, 2, 2), r"the padding code 3"),
    (struct.pack("<3i", -1, 2, 2), r"the padding code -1"),
    (struct.pack("<3i", 1, 0, 2), r"strides \[2, 0\] \(each must be at least 1\)"),
    (struct.pack("<3i", 2, 2, -2**31), r"strides \[-2147483648, 2\]"),
    (struct.pack("<3i", 1, 3, 2), r"an output of shape \[1, 16, 16, 4\] where its input, weights, strides and "
                                  r"padding give \[1, 16, 23, 4\]"),
])
def test_bad_custom_options_are_one_line(options, match):
    builtin, _ = case_model("same_k2_s2")
    with pytest.raises(ModelFormatError, match=rf"^m\.tflite: operator 0 \(the custom op "
                                               rf"'Convolution2DTransposeBias'\) has {match}") as e:
        import_tflite(as_custom(builtin, options), "m.tflite")
    assert "\n" not in str(e.value)


def test_bad_operands_are_refused():
    w = np.ones((4, 2, 2, 5), np.float32)  # 5 input channels for a 3-channel input
    model = as_custom(builtin_model((1, 8, 8, 3), w, np.zeros(4, np.float32), SAME, (2, 2)))
    with pytest.raises(ModelFormatError, match=r"operator 0 \(the custom op 'Convolution2DTransposeBias'\) has "
                                               r"weights of shape \[4, 2, 2, 5\] for an input of 3 channels"):
        import_tflite(model, "m.tflite")
    builtin, _ = case_model("same_k2_s2")
    with pytest.raises(UnsupportedError, match=r"operator 0 \(the custom op 'Convolution2DTransposeBias'\) is on "
                                               r"int8 tensors; MediaPipe's kernel is float32 only"):
        import_tflite(as_custom(builtin, quant=True), "m.tflite")
    m = schema.ModelT.InitFromPackedBuf(as_custom(builtin), 0)
    m.subgraphs[0].operators[0].inputs = m.subgraphs[0].operators[0].inputs[:2]  # no bias
    b = flatbuffers.Builder(4096)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    with pytest.raises(ModelFormatError, match=r"has 2 inputs \(Convolution2DTransposeBias takes the input, the "
                                               r"weights and the bias\)"):
        import_tflite(bytes(b.Output()), "m.tflite")


def _options_at(model: bytes) -> int:
    """Where operator 0's custom options vector (its length field) lies in the file."""
    import tflite

    tab = tflite.Model.GetRootAsModel(model, 0).Subgraphs(0).Operators(0)._tab
    return tab.Indirect(tab.Pos + tab.Offset(14))


def test_mutated_options_end_cleanly():
    """Every byte of the options, and their length, set to extremes: imported or one clean error."""
    builtin, _ = case_model("same_k3_s2_odd")
    model = as_custom(builtin)
    at = _options_at(model)
    assert struct.unpack_from("<I3i", model, at) == (12, 1, 2, 2)
    outcomes = set()
    for pos in range(at, at + 16):
        for value in (0, 1, 2, 3, 0x7F, 0x80, 0xFF):
            data = bytearray(model)
            data[pos] = value
            try:
                import_tflite(bytes(data), "m.tflite")
                outcomes.add("imported")
            except NpuforgeError as e:
                assert "\n" not in str(e) and str(e).startswith("m.tflite: "), str(e)
                outcomes.add(type(e).__name__)
    assert outcomes == {"imported", "ModelFormatError"}
    for length in (0xFFFFFFFF, 0x7FFFFFFF, len(model)):
        data = bytearray(model)
        struct.pack_into("<I", data, at, length)
        with pytest.raises(ModelFormatError, match=r"corrupt or truncated TFLite file: the custom options of "
                                                   r"operator 0 .* lies outside"):
            import_tflite(bytes(data), "m.tflite")


@pytest.mark.slow
def test_mutated_files_end_cleanly(tmp_path):
    builtin, _ = case_model("same_k4_s2_even", then="LOGISTIC")
    data = as_custom(builtin)
    for k, mutated in enumerate(mutations(data, random.Random("tflite-custom"), fuzz_cases(150))):
        path = tmp_path / f"custom_{k}.tflite"  # a failing case's file stays behind, to replay
        path.write_bytes(mutated)
        for command in ("inspect", "check"):
            run_case([command, path], protect=[path])
        path.unlink()


# -- the real model -------------------------------------------------------------------------------------------

SELFIE = Path(os.environ.get("NPUFORGE_REAL_MODELS", "/work/realmodels/models")) / \
    "mediapipe-0.10.14/mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite"


def test_real_selfie_segmentation_matches_litert():
    """MediaPipe's selfie segmentation (float16 weights behind DEQUANTIZE, the custom op as its
    upsampling head, a sigmoid after it): its logits (the custom op's output) and its mask against
    LiteRT running the same file with the op rewritten as TRANSPOSE_CONV."""
    if not SELFIE.is_file():
        pytest.skip(f"{SELFIE} is absent (mediapipe 0.10.14's wheel extracted; see benchmarks/real_models.py)")
    model = SELFIE.read_bytes()
    graph = npuforge.load(SELFIE)
    ct = [n for n in graph.nodes if n.op == "ConvTranspose"]
    assert len(ct) == 1 and ct[0].name == "transpose_conv_bias_244"
    builtin = with_builtin_transpose_conv(model)
    logits = [k for k, t in enumerate(schema.ModelT.InitFromPackedBuf(builtin, 0).subgraphs[0].tensors)
              if t.name == b"segment"][0]
    for seed in (0, 1):
        x = np.random.default_rng(seed).uniform(0, 1, (1, 256, 256, 3)).astype(np.float32)
        mask, ref_logits = litert_run(builtin, x, [logits])
        ours = graph.run({graph.inputs[0]: nchw(x)}, outputs=[ct[0].outputs[0], graph.outputs[0]])
        assert rel(ours[ct[0].outputs[0]], nchw(ref_logits)) < 1e-4
        assert np.abs(ours[graph.outputs[0]] - nchw(mask)).max() < 1e-4
