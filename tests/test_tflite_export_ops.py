"""The TFLite mappings for sequence / transformer ops and ``quantize --target tflite``, against
LiteRT's reference kernels (as tests/test_tflite_vs_litert.py): each small module is quantized
for TFLite on seeded random data, exported, and run on fresh inputs; every output code must
equal the integer simulator's. Shapes are drawn from a seeded generator per case.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")

import npuforge  # noqa: E402
from npuforge.export.litert_check import compare, interpreter, run_litert  # noqa: E402
from npuforge.export.tflite_export import to_tflite  # noqa: E402
from npuforge.passes import optimize  # noqa: E402
from npuforge.quant import QuantConfig  # noqa: E402
from npuforge.sim.integer import IntegerSimulator, quantize_input  # noqa: E402

TARGET = QuantConfig(target="tflite")


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _feed(rng, shape, ids: int, scale: float):
    """A float input, or token ids below ``ids`` (int64) when ``ids`` is set."""
    if ids:
        return rng.integers(0, ids, shape).astype(np.int64)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def exported(module: nn.Module, shapes: list, ids: int = 0, seed: int = 0, config: QuantConfig = TARGET, log=None):
    """(quantized IR, .tflite bytes) of ``module`` calibrated on seeded inputs of ``shapes``."""
    rng = np.random.default_rng(seed)
    example = tuple(torch.from_numpy(_feed(rng, s, ids, 1.0)) for s in shapes)
    graph = npuforge.from_torch(module.eval(), example if len(example) > 1 else example[0], dynamic_batch=False)
    calib = [{n: _feed(rng, s, ids, 1.0) for n, s in zip(graph.inputs, shapes)} for _ in range(4)]
    q = npuforge.quantize(graph, calib, config, log=log or (lambda m: None))
    return q, to_tflite(q)


def assert_bit_exact(module: nn.Module, shapes: list, ids: int = 0, seed: int = 0, runs: int = 2,
                     config: QuantConfig = TARGET, log=None):
    q, model = exported(module, shapes, ids, seed, config, log)
    sim, it = IntegerSimulator(q), interpreter(model)
    rng = np.random.default_rng(seed + 1)
    for _ in range(runs):
        raw = {n: _feed(rng, s, ids, 1.2) for n, s in zip(q.inputs, shapes)}
        feeds = {n: a if ids else quantize_input(a, q.values[n].quant) for n, a in raw.items()}
        ours = sim.run(feeds, dequantize=False)
        theirs = run_litert(it, [feeds[n].astype(np.int32) if ids else feeds[n] for n in q.inputs])
        for name, t in zip(q.outputs, theirs):
            o = ours[name].astype(np.int64)
            assert o.shape == t.shape, name
            diff = np.flatnonzero(o != t.astype(np.int64))
            assert diff.size == 0, f"{name}: {diff.size} of {o.size} codes differ, first at {diff[:3]}"
    return q, model


def op_names(model: bytes) -> list:
    from npuforge.export.cli import _tflite_ops

    return _tflite_ops(model)


def dims(rng, rank: int, low: int = 1, high: int = 9) -> tuple:
    return tuple(int(d) for d in rng.integers(low, high, rank))


@pytest.mark.parametrize("seed", range(3))
def test_batch_matmul_of_two_activations(seed):
    rng = np.random.default_rng(seed)
    b, m, k, n = dims(rng, 4, 2)
    shapes = {0: [(1, m, k), (1, k, n)], 1: [(1, b, m, k), (1, b, k, n)], 2: [(b, m, k), (k, n)]}[seed]
    _, model = assert_bit_exact(Lambda(lambda x, y: x @ y), shapes, seed=seed)
    assert "BATCH_MATMUL" in op_names(model)


def _with_scales(q, node, kind: str, scales: dict, config: QuantConfig = TARGET):
    """``q`` with the int8 scales and zero points of ``scales`` set on ``node``'s values, its
    multipliers derived again by the quantizer (as from a calibration that found them)."""
    from npuforge.quant.quantize import _quantize_node

    for name, (s, z) in scales.items():
        p = q.values[name].quant
        p.dtype, p.scale, p.zero_point = "int8", np.array(s, np.float32), np.array(z, np.int32)
    _quantize_node(q, node, kind, config, [])


def test_batch_matmul_multiplier_is_litert_s():
    """LiteRT's BATCH_MATMUL derives its multiplier from the float32 product of the input scales,
    divided in double (kernel_util's GetQuantizedConvolutionMultipler): 1751095165 on GCViT's attention
    scales, where the float64 product gives 1751095089. An accumulator of 39871 then gives 55 in
    LiteRT (its doubling high multiply lands on 32511.5) and 54 with the float64 multiplier."""
    q, _ = exported(Lambda(lambda x, y: x @ y), [(1, 1, 2), (1, 2, 1)])
    node = next(n for n in q.nodes if n.op == "MatMul")
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    _with_scales(q, node, "matmul", {a: (0.0033882095012813807, -114), b: (0.021494735032320023, -1),
                                     y: (0.045729078352451324, -9)})
    assert int(q.values[node.quant["multiplier"]].data[0]) == 1751095165
    it, sim = interpreter(to_tflite(q)), IntegerSimulator(q)
    tie = [np.array([[[127, 79]]], np.int8), np.array([[[126], [47]]], np.int8)]  # (127+114)126+1) + (79+114)(47+1)
    rng = np.random.default_rng(0)
    for codes in [tie] + [[rng.integers(-128, 128, (1, 1, 2)).astype(np.int8),
                           rng.integers(-128, 128, (1, 2, 1)).astype(np.int8)] for _ in range(200)]:
        ours = sim.run({a: codes[0], b: codes[1]}, dequantize=False)[y]
        np.testing.assert_array_equal(run_litert(it, codes)[0], ours, err_msg=str(codes))
    assert int(sim.run({a: tie[0], b: tie[1]}, dequantize=False)[y].item()) == 55


def test_per_tensor_fully_connected_multiplier_is_litert_s():
    """A FULLY_CONNECTED with one weight scale does not take BATCH_MATMUL's multiplier: LiteRT 2.3
    multiplies the input and weight scales in double. On output scales where the float32 product's
    multiplier differs, an accumulator where their single roundings differ (weights 127 and 1 reach
    every one) gives the double product's result, in LiteRT and in the simulator."""
    from npuforge.quant.requant import quantize_multiplier, tflite_product_multiplier

    config = QuantConfig(target="tflite", granularity="per-tensor", weight_method="minmax")
    linear = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 1.0 / 127]]))
    q, _ = exported(linear, [(1, 2)], config=config)
    node = next(n for n in q.nodes if n.op in ("Gemm", "MatMul"))
    x, y = node.inputs[0], node.outputs[0]
    rng = np.random.default_rng(0)
    acc = np.arange(-16000, 16001, dtype=np.int64)  # 127 hi + lo, both int8
    for _ in range(1000):  # output scales until the two multipliers round some accumulator apart
        s_x, s_y = 0.02, float(np.float32(rng.uniform(0.01, 0.05)))
        _with_scales(q, node, "compute", {x: (s_x, 0), y: (s_y, 0)}, config)
        s_w = q.values[node.inputs[1]].quant.scale
        (m32, m64), (shift, _) = quantize_multiplier(np.concatenate([
            np.atleast_1d(tflite_product_multiplier(s_x, s_w, s_y)),
            np.atleast_1d(np.float64(np.float32(s_x)) * np.float64(s_w) / np.float64(s_y))]))
        once = [(acc * int(m) + (1 << (30 - int(shift)))) >> (31 - int(shift)) for m in (m32, m64)]
        apart = acc[once[0] != once[1]]
        if apart.size:
            break
    assert apart.size and int(q.values[node.quant["multiplier"]].data.reshape(-1)[0]) == int(m64)
    it, sim = interpreter(to_tflite(q)), IntegerSimulator(q)
    for a in apart[:20]:
        hi = int(np.clip(np.round(a / 127), -128, 127))
        codes = np.array([[hi, int(a) - 127 * hi]], np.int8)
        assert int(codes[0, 0]) * 127 + int(codes[0, 1]) == a
        np.testing.assert_array_equal(run_litert(it, [codes])[0], sim.run({x: codes}, dequantize=False)[y],
                                      err_msg=f"accumulator {a}")


@pytest.mark.parametrize("shape", [(1, 5, 16), (1, 3, 4, 16), (2, 7, 16)])
def test_matmul_by_a_constant_is_fully_connected_keeping_leading_dims(shape):
    _, model = assert_bit_exact(nn.Linear(16, 6), [shape])
    assert "FULLY_CONNECTED" in op_names(model)


@pytest.mark.parametrize("shape,dim", [((1, 7, 5), 1), ((1, 3, 7, 5), 2), ((1, 3, 7, 5), 3), ((1, 3, 7, 5), 1),
                                       ((2, 4, 9), 0)])
def test_softmax_on_any_axis(shape, dim):
    _, model = assert_bit_exact(nn.Softmax(dim), [shape])
    assert "SOFTMAX" in op_names(model)


@pytest.mark.parametrize("shape,axes,keep", [((1, 6, 10), (-1,), False), ((1, 6, 10), (-1,), True),
                                             ((1, 6, 4, 5), (1,), True), ((1, 6, 4, 5), (2,), False),
                                             ((1, 6, 4, 5), (1, 3), False), ((2, 3, 8), (1, 2), False)])
def test_mean_over_any_axes(shape, axes, keep):
    _, model = assert_bit_exact(Lambda(lambda x: x.mean(axes, keepdim=keep)), [shape])
    assert "MEAN" in op_names(model)


@pytest.mark.parametrize("fn,op", [(lambda x: x.amax(-1), "REDUCE_MAX"), (lambda x: x.amin((2, 3)), "REDUCE_MIN"),
                                   (lambda x: x.amax(1, keepdim=True), "REDUCE_MAX")])
def test_reduce_max_and_min_select_codes(fn, op):
    _, model = assert_bit_exact(Lambda(fn), [(1, 6, 4, 5)])
    assert op in op_names(model)


@pytest.mark.parametrize("alpha", [0.01, 0.2, 1.5])
def test_leaky_relu_standalone_and_split_off_a_convolution(alpha):
    _, model = assert_bit_exact(nn.LeakyReLU(alpha), [(1, 4, 5, 5)])
    assert op_names(model) == ["LEAKY_RELU"]
    _, model = assert_bit_exact(nn.Sequential(nn.Conv2d(4, 6, 3), nn.LeakyReLU(alpha)), [(1, 4, 7, 7)])
    assert op_names(model) == ["CONV_2D", "LEAKY_RELU"]


def test_fused_leaky_relu_without_target_names_the_switch():
    conv = nn.Sequential(nn.Conv2d(4, 6, 3), nn.LeakyReLU(0.1))
    with pytest.raises(npuforge.NpuforgeError, match=r"Conv.*no fused LeakyRelu.*--target tflite"):
        exported(conv, [(1, 4, 7, 7)], config=QuantConfig(activation_dtype="int8", tflite_multipliers=True))


@pytest.mark.parametrize("fn,op", [(lambda x: torch.sigmoid(x).reshape(1, -1), "LOGISTIC"),
                                   (lambda x: torch.tanh(x).flatten(1), "TANH"),
                                   (lambda x: torch.softmax(x, -1).reshape(1, -1), "SOFTMAX")])
def test_fixed_output_grid_is_looked_up_through_a_reshape(fn, op):
    """A Sigmoid / Tanh / Softmax feeding the graph output through a Reshape gets TFLite's output grid
    (it used to keep its calibrated one: a table, or a refusal for SOFTMAX)."""
    q, model = assert_bit_exact(Lambda(fn), [(1, 4, 3, 3)])
    assert op in op_names(model) and "GATHER" not in op_names(model)


@pytest.mark.parametrize("seed", range(2))
def test_prelu_as_prelu(seed):
    rng = np.random.default_rng(seed)
    c, h, w = dims(rng, 3, 2)
    prelu = nn.PReLU(c)
    with torch.no_grad():
        prelu.weight.uniform_(-0.5, 0.5)
    _, model = assert_bit_exact(nn.Sequential(nn.Conv2d(3, c, 1), prelu), [(1, 3, h, w)], seed=seed)
    assert op_names(model) == ["CONV_2D", "PRELU"]


@pytest.mark.parametrize("shape,slopes", [((1, 6, 10), 6), ((1, 4, 5, 5), 1)])
def test_prelu_on_a_signal_and_with_one_slope(shape, slopes):
    prelu = nn.PReLU(slopes)
    with torch.no_grad():
        prelu.weight.uniform_(-0.5, 0.5)
    _, model = assert_bit_exact(nn.Sequential(Lambda(lambda x: x * 1.5), prelu), [shape])
    assert "PRELU" in op_names(model)


class MaxMin(nn.Module):
    """Max / Min of two activations, Min with a per-channel constant, a Clip with a computed floor."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
        self.bound = nn.Parameter(torch.linspace(-0.5, 0.5, 4).reshape(1, 4, 1, 1), requires_grad=False)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        both = torch.minimum(torch.maximum(a, b), self.bound)
        return torch.clamp(both, min=both.amax() - 1.0)


def test_max_min_and_computed_clip_as_maximum_minimum():
    _, model = assert_bit_exact(MaxMin(), [(1, 3, 5, 6)])
    ops = op_names(model)
    assert ops.count("MAXIMUM") == 2 and ops.count("MINIMUM") == 1


@pytest.mark.parametrize("shape,normalized", [((1, 5, 16), (16,)), ((2, 4, 12), (4, 12)), ((1, 3, 7, 8), (8,))])
def test_layer_norm_as_builtins(shape, normalized):
    norm = nn.LayerNorm(normalized)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.3, 0.3)
    _, model = assert_bit_exact(norm, [shape])
    ops = op_names(model)
    assert ops.count("MEAN") == 2 and "GATHER" in ops  # mean, variance; the table of v ^ -0.5


def test_instance_norm_and_l2_normalize_as_builtins():
    norm = nn.GroupNorm(1, 6)  # (poolformer's norm: InstanceNormalization between Reshapes)
    _, model = assert_bit_exact(nn.Sequential(nn.Conv2d(3, 6, 1), norm), [(1, 3, 5, 5)])
    assert op_names(model).count("MEAN") == 2
    _, model = assert_bit_exact(Lambda(lambda x: F.normalize(x, dim=-1)), [(1, 6, 12)])
    assert "MEAN" in op_names(model) and "GATHER" in op_names(model)


@pytest.mark.parametrize("seed", range(3))
def test_average_pool_counting_its_padding_is_pad_then_valid(seed):
    """count_include_pad=1 (inception_v3): PAD with the zero point, then AVERAGE_POOL_2D VALID over whole
    windows, the codes' mean rounded half away as the simulator's code_average; seed 2: asymmetric pads
    (a Pad folded into the pool)."""
    rng = np.random.default_rng(seed)
    c, h, w = dims(rng, 3, 3, 12)
    k, s = int(rng.integers(2, 4)), int(rng.integers(1, 3))
    pool = nn.AvgPool2d(k, s, k // 2, count_include_pad=True) if seed < 2 else \
        Lambda(lambda x: F.avg_pool2d(F.pad(x, (0, 1, 1, 0)), k, s))
    _, model = assert_bit_exact(nn.Sequential(nn.Conv2d(3, c, 1), pool), [(1, 3, h, w)], seed=seed)
    assert op_names(model) == ["CONV_2D", "PAD", "AVERAGE_POOL_2D"]


@pytest.mark.parametrize("axes,keep", [((-1,), True), ((1,), False), ((2, 3), True)])
def test_reduce_sum_is_mean_times_count(axes, keep):
    """mobilevitv2's context vector: ReduceSum as MEAN and MUL by the element count (LiteRT's reference
    SUM does not compute its own integer program)."""
    _, model = assert_bit_exact(Lambda(lambda x: x.sum(axes, keepdim=keep)), [(1, 5, 4, 6)])
    assert {"MEAN", "MUL"} <= set(op_names(model)) and "SUM" not in op_names(model)


@pytest.mark.parametrize("fn,shapes", [
    (lambda x: F.relu(x) / (F.relu(x).sum(-1, keepdim=True) + 1e-3), [(1, 4, 16)]),  # linear attention
    (lambda x, d: x / (d.abs() + 0.5), [(1, 3, 8, 8), (1, 3, 8, 8)]),
    (lambda x, d: x / (d.abs() + 0.5), [(1, 3, 8, 8), (1, 1, 8, 1)]),  # a broadcast divisor
])
def test_div_by_an_activation_is_a_reciprocal_table_and_mul(fn, shapes):
    """Div by a computed value: a table of 1 / d (GATHER) and MUL, bit for bit with LiteRT (its int8 DIV
    shifts by 32 bits or more for numerator codes 0 and -1); as accurate as npuforge's exact division
    (measured: mean relative error 0.0133 / 0.0204 / 0.025 against 0.0133 / 0.0203 / 0.0246)."""
    q, model = assert_bit_exact(Lambda(fn), shapes, runs=3)
    assert "GATHER" in op_names(model) and "MUL" in op_names(model) and "DIV" not in op_names(model)
    graph = npuforge.from_torch(Lambda(fn).eval(), tuple(torch.zeros(s) for s in shapes) if len(shapes) > 1 else
                                torch.zeros(shapes[0]), dynamic_batch=False)
    rng = np.random.default_rng(0)
    calib = [{n: rng.standard_normal(s).astype(np.float32) for n, s in zip(graph.inputs, shapes)} for _ in range(8)]
    errors = {}
    for name, config in (("tflite", TARGET), ("exact", QuantConfig(tflite_multipliers=True))):
        q = npuforge.quantize(graph, calib, config, log=lambda m: None)
        sim, total = IntegerSimulator(q), 0.0
        for seed in range(8):
            r = np.random.default_rng(seed + 10)
            feeds = {n: r.standard_normal(s).astype(np.float32) for n, s in zip(q.inputs, shapes)}
            want = graph.run(feeds)[graph.outputs[0]]
            total += float(np.abs(sim.run(feeds)[q.outputs[0]] - want).mean() / np.abs(want).mean())
        errors[name] = total / 8
    assert "Div" in [n.op for n in q.nodes] and errors["tflite"] < 1.05 * errors["exact"], errors


@pytest.mark.parametrize("fn,shape,tiled", [(lambda x: x.repeat(1, 2, 3), (1, 4, 5), True),
                                            (lambda x: x[:, None].repeat(1, 3, 1, 2, 1), (1, 2, 4, 5), True),
                                            (lambda x: x.mean(-1, keepdim=True).expand(-1, -1, -1, 7), (1, 3, 4, 5),
                                             False),
                                            (lambda x: x.expand(2, -1, -1), (4, 5), False)])
def test_tile_and_expand_copy_codes(fn, shape, tiled):
    """Tile (gcvit's global query; torch writes it after an Expand to ones) and Expand (mobilevitv2's
    broadcast context; a rank change is broadcast in the IR's order): TILE and BROADCAST_TO."""
    _, model = assert_bit_exact(Lambda(fn), [shape])
    assert "BROADCAST_TO" in op_names(model) and ("TILE" in op_names(model)) == tiled


def test_near_constant_softmax_input_gets_the_smallest_step_tflite_takes():
    """An attention Softmax of random weights: its input range far below 255 * 2^-26. target='tflite'
    widens the step (noted); with TFLite's multipliers alone it is one line naming the way out."""
    from npuforge.quant.tflite_softmax import SMALLEST_STEP

    notes = []
    q, model = assert_bit_exact(Lambda(lambda x: torch.softmax(x * 1e-8, -1)), [(1, 6, 12)], log=notes.append)
    softmax = next(n for n in q.nodes if n.op == "Softmax")
    assert q.values[softmax.inputs[0]].quant.scale == SMALLEST_STEP and "SOFTMAX" in op_names(model)
    assert any("(Softmax): its input step" in n and "widened to 1.49e-08" in n for n in notes), notes
    with pytest.raises(npuforge.NpuforgeError, match=r"input step .* not above the 2\^-26 .*target 'tflite'"):
        exported(Lambda(lambda x: torch.softmax(x * 1e-8, -1)), [(1, 6, 12)],
                 config=QuantConfig(activation_dtype="int8", tflite_multipliers=True))


def test_shape_reading_ops_get_4d_tensors_in_the_ir_shape():
    """A 4-D operand whose NHWC and NCHW orders agree (C == 1) still needs the IR's shape."""
    assert_bit_exact(Lambda(lambda x, y: x @ y), [(1, 1, 5, 8), (1, 1, 8, 6)])
    assert_bit_exact(nn.Linear(8, 4), [(1, 1, 5, 8)])


def test_clip_bounds_of_no_builtin_are_a_table():
    _, model = assert_bit_exact(Lambda(lambda x: x.clamp(-0.5, 2.0)), [(1, 4, 5, 5)])
    assert "GATHER" in op_names(model)


class Boxes(nn.Module):
    """A detector head: box regressors whose range is far from the scores' (int16 Concat by default)."""

    def __init__(self, after: str = ""):
        super().__init__()
        self.after = after
        self.stem, self.boxes, self.scores = nn.Conv2d(3, 8, 3, 2), nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        with torch.no_grad():
            self.boxes.weight.mul_(100)
            self.boxes.bias.mul_(100)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        boxes = self.boxes(y)
        if self.after == "add":  # an int16 ADD of two int16 activations
            boxes = boxes + self.scores(y)
        elif self.after == "pool":  # no 16x8 program: the group stays 8-bit
            boxes = F.avg_pool2d(boxes, 3, 1, 1, count_include_pad=False)
        parts = [boxes, torch.sigmoid(self.scores(y)), self.dw(y)[:, :2]]
        return torch.cat(parts, 1).flatten(2).transpose(1, 2)


@pytest.mark.parametrize("seed,after", [(0, ""), (1, ""), (2, "add")])
def test_int16_concat_runs_in_16x8_mode(seed, after):
    """CONV_2D / DEPTHWISE_CONV_2D with int16 outputs (their int8 inputs widened by QUANTIZE), a table
    into int16 (GATHER), STRIDED_SLICE, CONCATENATION, RESHAPE, TRANSPOSE on int16 codes."""
    rng = np.random.default_rng(seed)
    h, w = dims(rng, 2, 9, 20)
    q, model = assert_bit_exact(Boxes(after), [(1, 3, h, w)], seed=seed)
    assert q.values[q.outputs[0]].quant.dtype == "int16"
    assert interpreter(model).get_output_details()[0]["dtype"] == np.int16
    ops = op_names(model)
    assert {"QUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "CONCATENATION"} <= set(ops)


def test_int16_group_without_a_16x8_program_stays_8_bit():
    notes = []
    graph = npuforge.from_torch(Boxes("pool").eval(), torch.zeros(1, 3, 12, 12), dynamic_batch=False)
    calib = [{graph.inputs[0]: np.random.default_rng(s).standard_normal((1, 3, 12, 12)).astype(np.float32)}
             for s in range(3)]
    q = npuforge.quantize(graph, calib, TARGET, log=notes.append)
    assert all(v.quant.dtype == "int8" for v in q.values.values() if v.quant is not None and not v.is_const)
    assert any("stay 8-bit for TFLite" in n and "(AveragePool)" in n for n in notes), notes
    to_tflite(q)


class BoxPath(nn.Module):
    """Regressor -> Mul by a per-box constant -> Add of anchors, concatenated with scores."""

    def __init__(self):
        super().__init__()
        self.stem, self.reg, self.cls = nn.Conv2d(3, 8, 3, 2), nn.Conv2d(8, 4, 1), nn.Conv2d(8, 2, 1)
        with torch.no_grad():
            self.reg.weight.mul_(50)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        boxes = self.reg(y) * torch.linspace(0.5, 3, 4).reshape(1, 4, 1, 1) + torch.linspace(-30, 30, 4).reshape(1, 4, 1, 1)
        return torch.cat([boxes, torch.sigmoid(self.cls(y))], 1), torch.tanh(boxes)


def test_int16_mul_add_of_constants_and_a_table_reading_int16():
    q, model = assert_bit_exact(BoxPath(), [(1, 3, 15, 15)], runs=3)
    dtypes = {n.op: q.values[n.outputs[0]].quant.dtype for n in q.nodes}
    assert dtypes["Add"] == dtypes["Mul"] == "int16" and dtypes["Tanh"] == "int8"  # a 65536-entry table
    assert len(q.values[next(n for n in q.nodes if n.op == "Tanh").name + "::lut"].data) == 65536
    assert {"MUL", "ADD", "GATHER"} <= set(op_names(model))


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.table, self.head = nn.Embedding(50, 16), nn.Linear(16, 4)

    def forward(self, ids):
        return self.head(self.table(ids))


def test_token_ids_gather_an_embedding_table():
    q, model = assert_bit_exact(Embed(), [(1, 7)], ids=50)
    assert op_names(model)[0] == "GATHER"
    it = interpreter(model)
    assert it.get_input_details()[0]["dtype"] == np.int32
    # the float-io file keeps its int32 ids input; compare() feeds integer inputs as they are
    floats = to_tflite(q, io="float")
    assert interpreter(floats).get_input_details()[0]["dtype"] == np.int32
    batches = [{q.inputs[0]: np.random.default_rng(s).integers(0, 50, (1, 7))} for s in range(2)]
    report = compare(q, model, batches)
    assert report["bit_exact_samples"] == 2 and report["codes_differing"] == 0


def test_class_token_is_a_gather_at_a_constant_index():
    _, model = assert_bit_exact(nn.Sequential(Lambda(lambda x: x[:, 0]), nn.Linear(8, 3)), [(1, 5, 8)])
    assert "GATHER" in op_names(model)


class ClassToken(nn.Module):
    """A ViT's start: a learnt class token (a constant) concatenated before the patch tokens."""

    def __init__(self):
        super().__init__()
        self.token, self.proj = nn.Parameter(torch.randn(1, 1, 8)), nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(torch.cat([self.token.expand(x.shape[0], -1, -1), x], 1))


def test_a_constant_concatenated_with_activations_is_written_as_codes():
    _, model = assert_bit_exact(ClassToken(), [(1, 6, 8)])
    assert "CONCATENATION" in op_names(model)


def test_a_float_value_names_its_node_and_the_option_that_kept_it():
    module = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 1))
    graph = optimize(npuforge.from_torch(module.eval(), torch.zeros(1, 3, 4, 4), dynamic_batch=False))[0]
    calib = [{graph.inputs[0]: np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)}]
    q = npuforge.quantize(graph, calib, QuantConfig(target="tflite", keep_float=[graph.nodes[0].name]),
                          log=lambda m: None)
    with pytest.raises(npuforge.NpuforgeError, match=r"kept in float by --keep-float.*leave it out"):
        to_tflite(q)


def test_target_tflite_settles_the_options():
    c = QuantConfig(target="tflite", activation_dtype="uint8")
    assert c.tflite_multipliers and c.activation_dtype == "int8" and c.norm_spread_codes == 0
    with pytest.raises(npuforge.NpuforgeError, match="target='tflite2' is not one of"):
        QuantConfig(target="tflite2")


class Detector(nn.Module):
    """A fused LeakyRelu, a Concat of far-apart ranges (int16 by default), a Reshape folding a symbolic batch."""

    def __init__(self):
        super().__init__()
        self.stem, self.act = nn.Conv2d(3, 8, 3, 2), nn.LeakyReLU(0.1)
        self.boxes, self.scores = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.act(self.stem(x))
        scores = torch.sigmoid(self.scores(y))
        return torch.cat([self.boxes(y) * 100, scores], 1).flatten(1), scores.reshape(1, -1)


def test_quantize_target_tflite_always_exports(tmp_path, capsys):
    from PIL import Image

    from npuforge.cli import main

    rng = np.random.default_rng(0)
    (tmp_path / "images" / "a").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(tmp_path / "images" / "a" / f"{i}.png")
    torch.manual_seed(0)
    npuforge.export_onnx(Detector().eval(), torch.zeros(1, 3, 32, 32), str(tmp_path / "det.onnx"))
    common = ["--calib", str(tmp_path / "images"), "--num-calib", "4", "-q"]
    assert main(["quantize", str(tmp_path / "det.onnx"), *common, "--tflite-multipliers", "-o",
                 str(tmp_path / "plain.nfir")]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "plain.nfir"), "--format", "tflite", "-o", str(tmp_path / "p.tflite")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--target tflite" in err and "--tflite-multipliers" not in err and err.count("\n") == 0
    assert main(["quantize", str(tmp_path / "det.onnx"), *common, "--target", "tflite", "-o",
                 str(tmp_path / "q.nfir")]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "q.nfir"), "--format", "tflite", "-o", str(tmp_path / "q.tflite"),
                 "--check-litert", "3"]) == 0
    out = capsys.readouterr().out
    assert "3/3 random inputs bit-exact, 0 of" in out and "LEAKY_RELU" in out


def test_a_softmax_row_that_would_abort_litert_reference_is_refused_not_run():
    """LiteRT's reference SOFTMAX aborts the process when a row's exponentials reach 512 (a uniform row of
    512); compare() refuses such a model in one line instead of letting LiteRT end the test run."""
    q, model = exported(Lambda(lambda x: torch.softmax(x * 0.0, -1)), [(1, 2, 512)])
    with pytest.raises(npuforge.NpuforgeError, match="rows of 512 entries whose exponentials sum to 512"):
        compare(q, model, [{q.inputs[0]: np.zeros((1, 2, 512), np.float32)}])
    # rows as long whose exponentials stay far below (one entry well above the rest): checked as any other
    q, model = exported(Lambda(lambda x: torch.softmax(x * 8.0, -1)), [(1, 2, 600)])
    x = np.zeros((1, 2, 600), np.float32)
    x[..., 7] = 4.0
    assert compare(q, model, [{q.inputs[0]: x}])["bit_exact_samples"] == 1
    assert assert_bit_exact(Lambda(lambda x: torch.softmax(x * 0.0, -1)), [(1, 2, 511)])  # one entry less runs


def _operator_inputs(model: bytes) -> list:
    """The number of inputs of each operator of the file's subgraph."""
    from tflite.Model import Model

    sub = Model.GetRootAs(model, 0).Subgraphs(0)
    return [sub.Operators(i).InputsLength() for i in range(sub.OperatorsLength())]


@pytest.mark.parametrize("kernel,stride,pad,out_pad,bias,ops", [
    (2, 2, 0, 0, True, ["TRANSPOSE_CONV"]),  # VALID (a U-Net's up-sampling)
    (2, 2, 0, 0, False, ["TRANSPOSE_CONV"]),
    (4, 2, 1, 0, True, ["TRANSPOSE_CONV"]),  # TFLite's SAME crops the head pad
    (3, 2, 1, 1, True, ["TRANSPOSE_CONV", "STRIDED_SLICE"]),  # pads SAME does not crop: VALID, then a crop
    (3, 2, 1, 1, False, ["TRANSPOSE_CONV", "STRIDED_SLICE"]),
    (5, 3, 2, 1, True, ["TRANSPOSE_CONV", "STRIDED_SLICE"]),  # a crop of the head and the tail
])
def test_conv_transpose_is_transpose_conv(kernel, stride, pad, out_pad, bias, ops):
    torch.manual_seed(0)
    up = nn.ConvTranspose2d(4, 6, kernel, stride, padding=pad, output_padding=out_pad, bias=bias)
    _, model = assert_bit_exact(up, [(1, 4, 5, 6)])
    assert op_names(model) == ops
    assert _operator_inputs(model)[0] == (4 if bias else 3)  # TRANSPOSE_CONV's bias input is optional


def test_conv_transpose_then_relu_and_fused_bounds():
    """A Relu after a ConvTranspose stays its own node in the IR (RELU); saturation bounds stored on the node
    are TRANSPOSE_CONV's fused activation (version 4), which LiteRT 2.3.0's reference kernel applies."""
    from npuforge.quant.quantize import _add_int
    from npuforge.quant.tflite_tables import activation_range

    torch.manual_seed(0)
    _, model = assert_bit_exact(nn.Sequential(nn.ConvTranspose2d(4, 6, 3, 2, 1, 1), nn.ReLU()), [(1, 4, 5, 5)])
    assert op_names(model) == ["TRANSPOSE_CONV", "STRIDED_SLICE", "RELU"]
    up = nn.ConvTranspose2d(4, 6, 2, 2)
    with torch.no_grad():
        up.weight.mul_(20)  # an output range past 6, so RELU6's bound cuts
    q, _ = exported(up, [(1, 4, 5, 5)])
    node, yq = q.nodes[0], q.values[q.outputs[0]].quant
    sim_in = quantize_input(np.random.default_rng(1).standard_normal((1, 4, 5, 5)).astype(np.float32) * 1.5,
                            q.values[q.inputs[0]].quant)
    for kind in ("Relu", "Relu6"):
        lo, hi = activation_range(kind, yq)
        _add_int(q, node, "act_min", np.asarray(lo, np.int32))
        _add_int(q, node, "act_max", np.asarray(hi, np.int32))
        model = to_tflite(q)
        ours = IntegerSimulator(q).run({q.inputs[0]: sim_in}, dequantize=False)[q.outputs[0]]
        theirs = run_litert(interpreter(model), [sim_in])[0]
        assert op_names(model) == ["TRANSPOSE_CONV"] and ours.min() == lo and (kind == "Relu" or ours.max() == hi)
        assert np.array_equal(ours.astype(np.int64), theirs.astype(np.int64)), kind


def test_conv_transpose_16x8():
    """An int16 output: the int8 input widened exactly (QUANTIZE), LiteRT's 16x8 TRANSPOSE_CONV with int64
    biases (its 64-bit requantization rounds once: the quantizer's single_rounding)."""
    torch.manual_seed(0)
    up = Lambda(nn.ConvTranspose2d(4, 6, 3, 2, padding=1, output_padding=1))
    q, model = assert_bit_exact(up, [(1, 4, 5, 5)], config=QuantConfig(target="tflite", int16=["/fn/ConvTranspose"]))
    assert q.values[q.outputs[0]].quant.dtype == "int16"
    assert op_names(model) == ["QUANTIZE", "TRANSPOSE_CONV", "STRIDED_SLICE"]


@pytest.mark.parametrize("kwargs,why", [(dict(groups=2), "no groups"), (dict(dilation=2), "no dilations")])
def test_conv_transpose_without_a_tflite_form_is_refused_in_one_line(kwargs, why):
    with pytest.raises(npuforge.NpuforgeError, match=f"node '.*ConvTranspose' \\(ConvTranspose\\): TFLite's "
                                                     f"TRANSPOSE_CONV has {why}") as e:
        exported(nn.ConvTranspose2d(4, 6, 3, 2, **kwargs), [(1, 4, 5, 5)])
    assert "\n" not in str(e.value)


class _Product(nn.Module):
    def forward(self, a, b):
        return a * b


def test_mul_multiplier_is_computed_in_float32_as_litert_does():
    """LiteRT's MUL derives its multiplier from s_a * s_b / s_y computed in float32 (mul.cc), which
    can differ from the float64 quotient by a few units of the quantized multiplier: with Swin-T's
    layer-norm scales (1215430144 against 1215430181, shift -7) a product of 8480 gives 37 in LiteRT
    and 38 in the float64 one. Every pair of codes, on those scales, equals LiteRT."""
    from npuforge.quant.requant import requant_multiplier, tflite_mul_multiplier

    q, data = exported(_Product(), [(1, 4, 8), (1, 4, 1)])
    node = next(n for n in q.nodes if n.op == "Mul")
    scales = {node.inputs[0]: (0.02246091701090336, -1), node.inputs[1]: (0.006917555816471577, -128),
              node.outputs[0]: (0.0351390466094017, -1)}
    for name, (s, z) in scales.items():
        p = q.values[name].quant
        p.dtype, p.scale, p.zero_point = "int8", np.array(s, np.float32), np.array(z, np.int32)
    real = tflite_mul_multiplier(*(scales[n][0] for n in (*node.inputs, node.outputs[0])))
    m, s = requant_multiplier(np.atleast_1d(real), True)
    assert (int(m[0]), int(s[0])) == (1215430144, -7)
    q.values[node.quant["multiplier"]].data, q.values[node.quant["shift"]].data = m, s
    it, sim = interpreter(to_tflite(q)), IntegerSimulator(q)
    for b in range(-128, 128):
        for start in range(0, 256, 32):
            a = np.arange(-128, 128, dtype=np.int8)[start:start + 32].reshape(1, 4, 8)
            codes = [a, np.full((1, 4, 1), b, np.int8)]
            ours = sim.run(dict(zip(node.inputs, codes)), dequantize=False)[node.outputs[0]]
            np.testing.assert_array_equal(run_litert(it, codes)[0], ours, err_msg=f"b = {b}")
