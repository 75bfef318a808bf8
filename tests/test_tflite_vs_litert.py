"""The integer simulator against LiteRT's reference kernels, op by op.

Each case is a small PyTorch module: imported, quantized with TFLite's arithmetic
(``tflite_multipliers=True``, int8 activations) on seeded random calibration data,
exported to int8 ``.tflite``, and run on fresh seeded inputs by LiteRT with
``OpResolverType.BUILTIN_REF`` (TFLite's reference kernels). The int8 output codes
must equal the integer simulator's bit for bit. Skipped when LiteRT is absent.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

litert = pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")

import npuforge  # noqa: E402
from npuforge.export.litert_check import interpreter, run_litert  # noqa: E402
from npuforge.export.tflite_export import to_tflite  # noqa: E402
from npuforge.quant import QuantConfig  # noqa: E402
from npuforge.sim.integer import IntegerSimulator, quantize_input  # noqa: E402

TFLITE = QuantConfig(activation_dtype="int8", tflite_multipliers=True)


def litert_run(model: bytes, codes: list, reference: bool = True) -> list:
    """Run a .tflite on int8 input codes (the IR's NCHW where 4-D); the output codes."""
    return run_litert(interpreter(model, reference), codes)


def quantized(module: nn.Module, shapes: list, seed: int = 0, scale: float = 1.0, config: QuantConfig = TFLITE):
    rng = np.random.default_rng(seed)
    example = tuple(torch.zeros(s) for s in shapes)
    graph = npuforge.from_torch(module.eval(), example if len(example) > 1 else example[0], dynamic_batch=False)
    calib = [{name: (rng.standard_normal(s) * scale).astype(np.float32) for name, s in zip(graph.inputs, shapes)}
             for _ in range(4)]
    return npuforge.quantize(graph, calib, config, log=lambda m: None)


def assert_bit_exact(module: nn.Module, shapes: list, seed: int = 0, scale: float = 1.0, runs: int = 3,
                     config: QuantConfig = TFLITE):
    q = quantized(module, shapes, seed, scale, config)
    model = to_tflite(q)
    sim = IntegerSimulator(q)
    rng = np.random.default_rng(seed + 1)
    for _ in range(runs):
        feeds = {name: quantize_input((rng.standard_normal(s) * scale * 1.2).astype(np.float32), q.values[name].quant)
                 for name, s in zip(q.inputs, shapes)}
        ours = sim.run(feeds, dequantize=False)
        theirs = litert_run(model, [feeds[n] for n in q.inputs])
        for name, t in zip(q.outputs, theirs):
            o = ours[name]
            assert o.shape == t.shape, name
            diff = np.flatnonzero(o.astype(np.int64) != t.astype(np.int64))
            assert diff.size == 0, (f"{name}: {diff.size} of {o.size} codes differ, first at {diff[:3]}: "
                                    f"ours {o.reshape(-1)[diff[:3]]}, LiteRT {t.reshape(-1)[diff[:3]]}")
    return q, model


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


@pytest.mark.parametrize("hw", [(7, 7), (5, 5), (3, 4), (16, 16), (10, 10), (1, 1), (20, 13)])
def test_mean(hw):
    assert_bit_exact(nn.AdaptiveAvgPool2d(1), [(1, 24, *hw)])


@pytest.mark.parametrize("stride,pad,k", [(1, 1, 3), (2, 1, 3), (2, 0, 3), (1, 0, 1), (2, 2, 5), (1, 2, 3)])
@pytest.mark.parametrize("act", ["none", "relu", "relu6"])
def test_conv(stride, pad, k, act):
    conv = nn.Conv2d(8, 16, k, stride, pad)
    layers = [conv] + {"none": [], "relu": [nn.ReLU()], "relu6": [nn.ReLU6()]}[act]
    assert_bit_exact(nn.Sequential(*layers), [(1, 8, 15, 14)])


@pytest.mark.parametrize("stride,mult", [(1, 1), (2, 1), (1, 2)])
def test_depthwise_conv(stride, mult):
    assert_bit_exact(nn.Sequential(nn.Conv2d(12, 12 * mult, 3, stride, 1, groups=12), nn.ReLU6()), [(1, 12, 16, 16)])


def test_dilated_conv():
    assert_bit_exact(nn.Conv2d(4, 8, 3, 1, 2, dilation=2), [(1, 4, 12, 12)])


@pytest.mark.parametrize("granularity", ["per-channel", "per-tensor"])
def test_fully_connected(granularity):
    config = QuantConfig(activation_dtype="int8", tflite_multipliers=True, granularity=granularity)
    assert_bit_exact(nn.Sequential(nn.Linear(40, 24), nn.ReLU()), [(1, 40)], config=config)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.a(x) + self.b(x)


def test_add_residual():
    assert_bit_exact(Residual(), [(1, 8, 9, 9)])


def test_add_sub_mul_of_inputs():
    assert_bit_exact(Lambda(lambda a, b: a + b), [(1, 6, 5, 5), (1, 6, 5, 5)], scale=2.0)
    assert_bit_exact(Lambda(lambda a, b: a - 3 * b), [(1, 6, 5, 5), (1, 6, 5, 5)])
    assert_bit_exact(Lambda(lambda a, b: a * b), [(1, 6, 5, 5), (1, 6, 5, 5)])


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_max_pool(k, s, p):
    assert_bit_exact(nn.MaxPool2d(k, s, p), [(1, 8, 12, 12)])


class ConcatPadFlatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 6, 1), nn.Conv2d(4, 5, 1)

    def forward(self, x):
        return F.pad(torch.cat([self.a(x), self.b(x)], dim=1), (1, 2, 0, 1)).flatten(1)


def test_concat_reshape_pad():
    assert_bit_exact(ConcatPadFlatten(), [(1, 4, 6, 7)])


@pytest.mark.parametrize("granularity", ["per-channel", "per-tensor"])
def test_fully_connected_rounds_once(granularity):
    """LiteRT's reference FULLY_CONNECTED requantizes with one rounding (CONV_2D with two):
    a classifier-sized layer over enough inputs tells the two apart."""
    config = QuantConfig(activation_dtype="int8", tflite_multipliers=True, granularity=granularity)
    torch.manual_seed(0)
    assert_bit_exact(nn.Linear(1280, 1000), [(1, 1280)], config=config, runs=20 if granularity == "per-tensor" else 6)


def test_uint8_activations_export_as_int8_shifted():
    """A uint8 graph's codes minus 128 are the int8 export's codes: LiteRT agrees after the shift."""
    from npuforge.export.litert_check import compare

    config = QuantConfig(activation_dtype="uint8", tflite_multipliers=True)
    module = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    q = quantized(module, [(1, 3, 16, 16)], config=config)
    rng = np.random.default_rng(3)
    report = compare(q, to_tflite(q), [{"input": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
                                       for _ in range(3)])
    assert report["bit_exact_samples"] == 3 and report["codes_differing"] == 0


def test_export_refuses_npuforge_arithmetic_naming_the_node():
    q = quantized(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), [(1, 3, 8, 8)], config=QuantConfig())
    with pytest.raises(npuforge.NpuforgeError, match=r"node '.*Conv.*'.*--target tflite"):
        to_tflite(q)


def test_cli_export_writes_and_checks(tmp_path, capsys):
    from npuforge.cli import main

    q = quantized(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU6()), [(1, 3, 8, 8)])
    npuforge.save(q, tmp_path / "q.nfir")
    out = tmp_path / "q.tflite"
    assert main(["export", str(tmp_path / "q.nfir"), "--format", "tflite", "-o", str(out), "--check-litert", "2"]) == 0
    text = capsys.readouterr().out
    assert out.stat().st_size > 0 and "CONV_2D 1" in text and "2/2 random inputs bit-exact" in text
    plain = quantized(nn.Sequential(nn.Conv2d(3, 4, 3)), [(1, 3, 8, 8)], config=QuantConfig())
    npuforge.save(plain, tmp_path / "plain.nfir")
    before = out.read_bytes()
    assert main(["export", str(tmp_path / "plain.nfir"), "--format", "tflite", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--target tflite" in err
    assert out.read_bytes() == before  # the earlier export is left as it was


@pytest.mark.parametrize("act", [nn.ReLU(), nn.ReLU6(), nn.Hardtanh(-1.0, 1.0), nn.Sigmoid(), nn.Tanh(), nn.Hardswish()],
                         ids=["relu", "relu6", "relu_n1_to_1", "logistic", "tanh", "hard_swish"])
def test_activations(act):
    """Standalone (after an Add, so not fused): TFLite's kernels over every input code."""
    assert_bit_exact(Lambda(lambda a, b: act(a + b)), [(1, 4, 16, 16), (1, 4, 16, 16)], scale=3.0)


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 1, 0), (3, 2, 0)])
def test_average_pool(k, s, p):
    assert_bit_exact(nn.AvgPool2d(k, s, p), [(1, 8, 12, 12)])


@pytest.mark.parametrize("factor", [2, 3])
def test_resize_nearest(factor):
    assert_bit_exact(nn.Sequential(nn.Conv2d(3, 4, 1), nn.Upsample(scale_factor=factor, mode="nearest")),
                     [(1, 3, 5, 6)])


def test_quantize_dequantize_float_io():
    """--io float: LiteRT's QUANTIZE and DEQUANTIZE around the int8 graph give the simulator's
    dequantized outputs (random inputs: no quantization ties)."""
    q = quantized(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU6()), [(1, 3, 8, 8)])
    model = to_tflite(q, io="float")
    it = litert.Interpreter(model_content=model, experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], x.transpose(0, 2, 3, 1).copy())
    it.invoke()
    theirs = it.get_tensor(it.get_output_details()[0]["index"]).transpose(0, 3, 1, 2)
    ours = IntegerSimulator(q).run({q.inputs[0]: x})[q.outputs[0]]
    assert theirs.dtype == np.float32 and np.array_equal(theirs, ours)


def test_onnx_runtime_lowering_runs_tflite_arithmetic():
    """The ONNX Runtime lowering of the integer simulator proves its formulas against the
    node's own rule, TFLite's included (one-rounding FC, three-multiplier ADD, MEAN, pools)."""
    from npuforge.sim.lowered import LoweredSimulator

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1), nn.Linear(8, 10)

        def forward(self, x):
            y = F.hardswish(F.avg_pool2d(self.a(x) + self.b(x), 2))
            return self.fc(y.mean((2, 3)))

    q = quantized(Net(), [(1, 3, 12, 12)])
    x = np.random.default_rng(4).standard_normal((1, 3, 12, 12)).astype(np.float32)
    plain = IntegerSimulator(q).run({q.inputs[0]: x}, dequantize=False)
    lowered = LoweredSimulator(q).run({q.inputs[0]: x}, dequantize=False)
    assert np.array_equal(plain[q.outputs[0]], lowered[q.outputs[0]])
    assert_bit_exact(Net(), [(1, 3, 12, 12)])


@pytest.mark.parametrize("scale,shape,dim", [(1.0, (1, 10), 1), (4.0, (1, 1000), 1), (0.2, (1, 7, 33), 2),
                                             (2.0, (1, 12, 5, 5), 1)])
def test_softmax(scale, shape, dim):
    """TFLite's fixed-point SOFTMAX (gemmlowp exp, Newton-Raphson reciprocal) on the 1/256 grid."""
    assert_bit_exact(Lambda(lambda x: torch.softmax(x, dim=dim)), [shape], scale=scale)


@pytest.mark.parametrize("factor,align", [(2, False), (2, True), (3, False), (0.5, False)])
def test_resize_bilinear(factor, align):
    """The integer bilinear rule (TFLite's 10-bit weights on the codes) against RESIZE_BILINEAR."""
    up = nn.Upsample(scale_factor=factor, mode="bilinear", align_corners=align)
    assert_bit_exact(nn.Sequential(nn.Conv2d(3, 4, 1), up), [(1, 3, 6, 8)], scale=2.0)


def test_integer_bilinear_is_within_a_code_of_the_float_op():
    """The rule's 10-bit weights approximate ONNX's exact bilinear: against fake-quant (float
    interpolation, then rounding) on the default uint8 grid, no code moves by more than one."""
    from npuforge.sim.fake_quant import run_fake_quant

    q = quantized(nn.Sequential(nn.Conv2d(3, 4, 1), nn.Upsample(scale_factor=2, mode="bilinear")), [(1, 3, 9, 7)],
                  config=QuantConfig())
    resize = next(n for n in q.nodes if n.op == "Resize")
    assert "half_pixel_centers" in resize.quant  # quantized, not kept in float
    x = np.random.default_rng(7).standard_normal((1, 3, 9, 7)).astype(np.float32)
    p = q.values[q.outputs[0]].quant
    ours = IntegerSimulator(q).run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]].astype(np.int64)
    fake = p.quantize(np.asarray(run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]])).astype(np.int64)
    assert np.abs(ours - fake).max() <= 1 and np.mean(ours == fake) > 0.9


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (0, 1, 3, 2), (0, 3, 1, 2)])
def test_transpose(perm):
    assert_bit_exact(nn.Sequential(nn.Conv2d(3, 4, 1), Lambda(lambda x: x.permute(*perm).contiguous())),
                     [(1, 3, 5, 6)])


@pytest.mark.parametrize("act", [nn.Hardsigmoid(), nn.SiLU(), nn.GELU(), nn.ELU(), nn.Softplus(), nn.Mish()],
                         ids=["hard_sigmoid", "swish", "gelu", "elu", "softplus", "mish"])
def test_tables_without_a_builtin_are_gathered(act):
    """An elementwise op TFLite has no int8 kernel for is its stored table: CAST, ADD, GATHER."""
    q, model = assert_bit_exact(Lambda(lambda a, b: act(a + b)), [(1, 4, 16, 16), (1, 4, 16, 16)], scale=3.0)
    assert "GATHER" in _tflite_op_names(model)


def _tflite_op_names(model: bytes) -> list:
    from npuforge.export.cli import _tflite_ops

    return list(_tflite_ops(model))


@pytest.mark.parametrize("fn", [lambda x: torch.cat(x.split([3, 5], dim=1)[::-1], 1),
                                lambda x: x[:, 1:7:2, 2:, :-3] + 0.0,
                                lambda x: x.flip(3)[:, :, :, 1:],
                                lambda x: torch.cat(x.chunk(3, dim=2), 3)],
                         ids=["split", "strided", "negative_step", "chunk"])
def test_split_and_slice_are_strided_slices(fn):
    q, model = assert_bit_exact(Lambda(lambda a, b: fn(a + b)), [(1, 8, 9, 10), (1, 8, 9, 10)], scale=2.0)
    assert "STRIDED_SLICE" in _tflite_op_names(model)


class OnSum(nn.Module):
    """``module(a + b)``: the Add keeps the module's input an activation of its own."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, a, b):
        return self.module(a + b)


@pytest.mark.parametrize("module", [nn.Conv1d(4, 6, 3, padding=1), nn.Conv1d(4, 8, 5, stride=2, dilation=1),
                                    nn.Conv1d(4, 4, 3, groups=4), nn.MaxPool1d(3, 2, 1),
                                    nn.Conv1d(4, 8, 3, padding=1, groups=2),  # Wav2Vec2's positional conv
                                    nn.Sequential(nn.Conv1d(4, 8, 3), nn.ReLU(), nn.Conv1d(8, 8, 3, groups=8),
                                                  nn.AvgPool1d(2))],  # a chain stays 2-D
                         ids=["conv1d", "conv1d_strided", "depthwise1d", "maxpool1d", "grouped1d", "chain1d"])
def test_one_dimensional_windows_run_as_two_dimensional(module):
    q, model = assert_bit_exact(OnSum(module), [(1, 4, 32), (1, 4, 32)], scale=2.0)
    assert not any(n.op in ("Unsqueeze", "Squeeze") for n in q.nodes)  # the export's own rewrite


@pytest.mark.parametrize("shape,groups", [((1, 8, 10, 10), 2), ((1, 12, 6, 6), 3)])
def test_grouped_convolution_runs_as_one_per_group(shape, groups):
    conv = nn.Sequential(nn.Conv2d(shape[1], 2 * shape[1], 3, padding=1, groups=groups), nn.ReLU())
    q, model = assert_bit_exact(OnSum(conv), [shape, shape], scale=2.0)
    assert _tflite_op_names(model).count("CONV_2D") == groups


@pytest.mark.parametrize("k,s,p", [(3, 2, 0), (2, 2, 0), (3, 2, 1)])
def test_max_pool_ceil_mode(k, s, p):
    assert_bit_exact(OnSum(nn.MaxPool2d(k, s, p, ceil_mode=True)), [(1, 4, 10, 11), (1, 4, 10, 11)], scale=2.0)
