"""The simulator's fast path (npuforge/sim/lowered.py, qoperator.py, monotone_fit.py)
against the plain integer simulator, bit for bit, and the proof machinery that
accepts or refuses a float formula for a requantization."""

from __future__ import annotations

import collections
import math
import re

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npuforge.errors import UnsupportedError
from npuforge.sim.int_ops import requantize_fixedpoint, requantize_single
from npuforge.sim.integer import IntegerSimulator
from npuforge.sim.lowered import LoweredSimulator, make_simulator, requant_candidates
from npuforge.sim.monotone_fit import fit, verify
from test_sim_integer import CONV_CASES, POOLS, binary_case, conv_case, pool_case, qp, requant_ints, G

MODES = ["fixedpoint", "single", "onnx"]


def both(g, feeds, mode):
    """Each lowering (ONNX Runtime's integer operators where the graph has uint8
    activations, and the float one) against the plain path, on every graph output, with no
    node whose output nothing reads; -> {form: lowered simulator}."""
    b = IntegerSimulator(g, mode).run(feeds, dequantize=False)
    lows = {}
    for form in ("qoperator", "float"):
        try:
            lows[form] = low = LoweredSimulator(g, mode, form=form)
        except UnsupportedError:
            if form == "qoperator" and all(g.values[n].quant.dtype == "uint8" for n in g.inputs):
                raise
            continue
        a = low.run(feeds, dequantize=False)
        for name in g.outputs:
            assert a[name].dtype == b[name].dtype
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name} ({mode}, {form})")
        used = {i for n in low.model.graph.node for i in n.input} | {o.name for o in low.model.graph.output}
        assert all(set(n.output) & used for n in low.model.graph.node), f"a node nothing reads ({form})"
        if form == "qoperator":
            assert_no_redundant_nodes(low.model)
    assert "float" in lows
    return lows


# -- the requantization proof ---------------------------------------------------------------


def exact_fn(mult, shift, zp, lo, hi, rule):
    def exact(acc):
        y = rule(torch.from_numpy(acc), torch.from_numpy(mult[:, None]), torch.from_numpy(shift[:, None])).numpy()
        return np.clip(y + zp, lo, hi) - zp
    return exact


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), shift=st.integers(-14, 1), zp=st.integers(0, 255),
       rule=st.sampled_from(["fixedpoint", "single", "onnx"]), biased=st.booleans(), folded=st.booleans())
def test_fit_is_exact_on_every_accumulator(seed, shift, zp, rule, biased, folded):
    """A proven formula equals the integer rule on *every* accumulator of its domain
    (checked exhaustively here, not through the proof's thresholds), with and without
    a large bias left to the formula (float64), for TFLite-normalized multipliers and
    for the quantizer's folded ones (shift 0)."""
    from npuforge.quant.requant import requant_multiplier

    rng = np.random.default_rng(seed)
    c = 3
    mult = rng.integers(2**30, 2**31, c).astype(np.int64)
    shifts = np.full(c, shift, np.int64)
    if folded:
        mult, shifts = (a.astype(np.int64) for a in requant_multiplier(mult * 2.0 ** (shifts - 31)))
    m = mult * 2.0 ** (shifts - 31)
    scale = m.astype(np.float32)
    # the bias left to the formula; the accumulator itself stays within float32's exact 2^24
    offset = rng.integers(-(2**23), 2**23, c) if biased else np.zeros(c, np.int64)
    if rule == "onnx":
        rq = lambda acc: torch.round(acc.to(torch.float32) * torch.from_numpy(scale[:, None])).to(torch.int64)  # noqa: E731
    else:
        fn = requantize_fixedpoint if rule == "fixedpoint" else requantize_single
        rq = lambda acc: fn(acc, torch.from_numpy(mult[:, None]), torch.from_numpy(shifts[:, None]))  # noqa: E731

    def exact(acc):
        return np.clip(rq(torch.from_numpy(acc + offset[:, None])).numpy() + zp, 0, 255) - zp

    reach = np.minimum(300 / m, 200_000).astype(np.int64)  # every level when the domain allows
    a, b = -reach - offset, reach - offset
    formula = None
    for group in requant_candidates(rule, m, scale, shifts, offset, negative=zp > 0):
        formula = fit(exact, group, a, b, np.full(c, -zp), np.full(c, 255 - zp))
        if formula is not None:
            break
    assert formula is not None
    for i in range(c):
        acc = np.arange(a[i], b[i] + 1)[None, :]
        ref = exact(np.repeat(acc, c, axis=0))[i]  # row i: channel i's rule
        np.testing.assert_array_equal(_evaluate_row(formula, i, acc, -zp, 255 - zp), ref)


def _evaluate_row(formula, i, acc, lo, hi):
    """Evaluate channel i's formula on the accumulators of one row."""
    import dataclasses

    row = dataclasses.replace(formula, r=formula.r[i:i + 1], b=None if formula.b is None else formula.b[i:i + 1],
                              pre=None if formula.pre is None else formula.pre[i:i + 1])
    return row.evaluate(acc, lo, hi)[0]


def test_verify_refuses_a_formula_off_by_one_step():
    """The proof is not vacuous: a formula whose offset is off by half a step fails it."""
    mult, shifts = np.array([1518500250], np.int64), np.array([-7], np.int64)
    exact = exact_fn(mult, shifts, 0, -128, 127, requantize_fixedpoint)
    m = mult * 2.0 ** (shifts - 31)
    groups = requant_candidates("fixedpoint", m, None, shifts, np.zeros(1, np.int64), negative=True)
    good = next(f for (f,) in groups if f.dtype == np.float64 and f.symmetric)
    a, b, lo, hi = np.array([-40000]), np.array([40000]), np.array([-128]), np.array([127])
    assert verify(exact, good, a, b, lo, hi).all()
    import dataclasses

    shifted = dataclasses.replace(good, b=good.b + 0.5 * m.astype(good.dtype) * 0.9)
    assert not verify(exact, shifted, a, b, lo, hi).any()
    plain_round = dataclasses.replace(good, symmetric=False)  # ties the wrong way below zero
    assert not verify(exact, plain_round, a, b, lo, hi).any()


# -- whole nodes, lowered against plain -----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_lowered_equals_plain(case, mode):
    rng = np.random.default_rng(300 + case)
    g, x, *_ = conv_case(rng, **CONV_CASES[case])
    lows = both(g, {"x": x}, mode)
    assert lows["float"].form == "float"
    if mode == "onnx":  # the rule itself; other modes only where a float32 scale is proven (see below)
        assert lows["qoperator"].lowering["n"] == "QLinearConv"


@pytest.mark.parametrize("u8u8", ["", "1"])
@pytest.mark.parametrize("group", [1, 8])
def test_conv_weights_signed_only_where_ort_sums_them_exactly(u8u8, group, monkeypatch):
    """QLinearConv takes the int8 weights as they are (u8s8, faster) where ONNX Runtime sums their
    products exactly (x86 with VNNI), as uint8 w + 128 (u8u8) elsewhere or with NPUFORGE_U8U8=1; the
    codes equal the plain path's either way, on the pair sums that saturate int16 (255 x 127 x 2)."""
    from npuforge.sim.qoperator import signed_weights_exact

    monkeypatch.setenv("NPUFORGE_U8U8", u8u8)
    rng = np.random.default_rng(77)
    g, x, *_ = conv_case(rng, cin=8, cout=8, group=group, wmax=127)
    x[:] = 255  # every input code at the uint8 end: many pairs of weights past 64 sum beyond int16
    low = both(g, {"x": x}, "onnx")["qoperator"]
    weights = [i for i in low.model.graph.initializer if i.name.endswith("::w")]
    assert len(weights) == 1
    signed = weights[0].data_type == onnx.TensorProto.INT8
    assert signed == (signed_weights_exact() and u8u8 == "")


@pytest.mark.parametrize("act,params", [("Relu", ()), ("Clip", (0.0, 6.0)), ("Clip", (-0.5, 0.7))])
@pytest.mark.parametrize("mode", MODES)
def test_conv_fused_activation_lowered(act, params, mode):
    rng = np.random.default_rng(320)
    g, x, *_ = conv_case(rng, act=act, act_params=params)
    both(g, {"x": x}, mode)


def test_conv_with_a_bias_beyond_float32_goes_through_float64():
    """A bias too large for the float32 kernel joins the requantization, added in float64."""
    rng = np.random.default_rng(330)
    g, x, *_ = conv_case(rng)
    bias = g.values[g.nodes[0].quant["bias"]]
    bias.data = (bias.data.astype(np.int64) * 20000).clip(-(2**31), 2**31 - 1).astype(np.int32)
    for mode in MODES:  # (the onnx rule rounds the biased sum to float32 itself)
        lows = both(g, {"x": x}, mode)
        assert mode == "onnx" or "float64" in lows["float"].lowering["n"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("geometry", [{"cin": 256, "hw": (4, 3)}, {"cin": 2048, "k": (1, 1), "pads": (0, 0, 0, 0),
                                                                 "hw": (3, 3)}])
def test_conv_with_accumulators_beyond_float32_runs_as_conv_integer(geometry, mode):
    """Sums beyond float32's exact 2^24 (ResNet's 3x3 convolutions over 256 channels):
    ONNX Runtime's exact u8u8 ConvInteger, cast to float64, then a float64 formula."""
    rng = np.random.default_rng(335)
    g, x, *_ = conv_case(rng, cout=5, **geometry)
    g.values["y"].quant.scale = np.float32(g.values["y"].quant.scale * 200)  # outputs inside the range
    m = np.float64(g.values["x"].quant.scale) * g.values["w"].quant.scale.astype(np.float64) / \
        np.float64(g.values["y"].quant.scale)
    g.values[g.nodes[0].quant["multiplier"]].data, g.values[g.nodes[0].quant["shift"]].data = \
        (v for v in requant_ints(m).values())
    plain = IntegerSimulator(g, mode)
    assert plain._prep_compute(g.nodes[0])["bound"] >= 2**24
    codes = plain.run({"x": x}, dequantize=False)["y"]
    assert 0 < (codes > codes.min()).mean() and (codes < codes.max()).mean() > 0.5  # not just the clamp
    low = both(g, {"x": x}, mode)["float"]
    assert mode == "onnx" or "float64" in low.lowering["n"]


def test_gemm_with_accumulators_beyond_float32_runs_in_double():
    g, x = gemm_case(371, batch=4, n=6, k=2500, y_scale=4.0)  # sum |w| * 136 > 2^24
    for mode in MODES:
        assert IntegerSimulator(g, mode)._prep_compute(g.nodes[0])["bound"] >= 2**24
        both(g, {"x": x}, mode)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("mode", MODES)
def test_elementwise_lowered_equals_plain(op, mode):
    rng = np.random.default_rng(340)
    g, a, b, *_ = binary_case(rng, op, ((2, 3, 4, 5), (1, 3, 1, 5)))
    both(g, {"a": a, "b": b}, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_add_of_two_activations_runs_as_qlinearadd_on_every_pair_of_codes(mode, seed):
    """An Add of two same-shaped uint8 activations runs as ONNX Runtime's QLinearAdd with ratios
    proven on the table of all its results; fed every one of the 65,536 pairs of codes here. A
    broadcast operand (which MLAS rounds another way) keeps the float lowering's table."""
    rng = np.random.default_rng(350 + seed)
    g, *_ = binary_case(rng, "Add", ((1, 1, 256, 256), (1, 1, 256, 256)))
    grid = np.arange(256, dtype=np.uint8)
    feeds = {"a": np.repeat(grid, 256).reshape(1, 1, 256, 256), "b": np.tile(grid, 256).reshape(1, 1, 256, 256)}
    assert both(g, feeds, mode)["qoperator"].lowering[g.nodes[0].name].startswith("QLinearAdd")
    g, a, b, *_ = binary_case(rng, "Add", ((2, 3, 4, 5), (1, 3, 1, 5)))
    assert "broadcast" in both(g, {"a": a, "b": b}, mode)["qoperator"].lowering[g.nodes[0].name]


def test_qlinearadd_kept_only_where_onnx_runtime_itself_agrees(monkeypatch):
    """The ratios the search finds are kept only if ONNX Runtime's own kernel gives the table on
    every pair of codes: where it does not (another kernel), the Add keeps the float lowering."""
    from npuforge.sim import qlinear_add

    monkeypatch.setattr(qlinear_add, "_FITTED", {})
    monkeypatch.setattr(qlinear_add, "_ort_grid", lambda *args: np.zeros((256, 256), np.int64))
    g, a, b, *_ = binary_case(np.random.default_rng(353), "Add")
    assert "no QLinearAdd ratios proven" in both(g, {"a": a, "b": b}, "fixedpoint")["qoperator"].lowering["n"]

    def no_kernel(*args):
        raise UnsupportedError("ONNX Runtime cannot load the lowered graph (no QLinearAdd)")

    monkeypatch.setattr(qlinear_add, "_FITTED", {})
    monkeypatch.setattr(qlinear_add, "_ort_grid", no_kernel)  # an ONNX Runtime that cannot run the proof
    assert "no QLinearAdd ratios proven" in both(g, {"a": a, "b": b}, "fixedpoint")["qoperator"].lowering["n"]


class ConstantOperands(torch.nn.Module):
    """Mul by a per-channel constant, Add a scalar, Sub from a constant map, and x * x."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.register_buffer("k", torch.tensor([0.5, -1.5, 2.0, 0.25]).reshape(4, 1, 1))
        self.register_buffer("m", torch.linspace(-1, 1, 4 * 6 * 6).reshape(4, 6, 6))

    def forward(self, x):
        y = torch.relu(self.conv(x)) * self.k + 0.5
        return (self.m - y) * (self.m - y)


@pytest.mark.parametrize("mode", MODES)
def test_elementwise_with_a_constant_or_itself_lowered_as_tables(mode):
    import npuforge

    torch.manual_seed(0)
    graph = npuforge.from_torch(ConstantOperands().eval(), torch.zeros(1, 3, 6, 6))
    rng = np.random.default_rng(345)
    q = npuforge.quantize(graph, [rng.standard_normal((4, 3, 6, 6)).astype(np.float32)], log=lambda m: None)
    ops = [n.op for n in q.nodes]
    assert ops.count("Mul") == 2 and ops.count("Add") + ops.count("Sub") >= 2
    x = q.values[q.inputs[0]].quant.quantize(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    lows = both(q, {q.inputs[0]: x}, mode)
    assert any("over one operand" in how for how in lows["float"].lowering.values())


class PaddedPools(torch.nn.Module):
    """Pads (constant 0.0, constant 0.3, reflect) and MaxPools (ceil mode, a dilated one) between
    convolutions: ONNX Runtime's uint8 ops on the codes in the QOperator form."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.a(x)  # outputs of both signs: the zero point inside the codes
        y = torch.nn.functional.max_pool2d(torch.nn.functional.pad(y, (1, 0, 0, 1), value=0.3), 2, stride=1,
                                           ceil_mode=True)
        y = torch.nn.functional.max_pool2d(torch.nn.functional.pad(y, (1, 1, 2, 0)), 3, stride=2, dilation=2,
                                           ceil_mode=True)
        return self.b(torch.nn.functional.pad(y, (1, 1, 1, 1), mode="reflect"))


@pytest.mark.parametrize("mode", MODES)
def test_pads_and_max_pools_run_on_the_codes(mode):
    g, x = quantized_graph(PaddedPools(), (2, 3, 17, 15))
    assert g.op_histogram()["Pad"] == 3 and g.op_histogram()["MaxPool"] == 2
    low = both(g, {g.inputs[0]: x}, mode)["qoperator"]
    hows = [how for name, how in low.lowering.items() if next(n for n in g.nodes if n.name == name).op in
            ("Pad", "MaxPool")]
    assert sorted(hows) == ["NhwcMaxPool"] * 2 + ["Pad of the codes"] * 3


class ChannelScales(torch.nn.Module):
    """Mul by one constant per channel: after a Concat on [N, C, H, W] (a batch norm that cannot
    fold), on a channels-last [N, H, W, C] and on [N, rows, C] (a layer scale); and by one value."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.Conv2d(3, 6, 1)
        self.g1 = torch.nn.Parameter(torch.linspace(-1.5, 2, 12).reshape(12, 1, 1))
        self.g2, self.g3 = torch.nn.Parameter(torch.linspace(0.1, 3, 12)), torch.nn.Parameter(torch.linspace(-2, 1, 12))

    def forward(self, x):
        y = torch.cat([self.a(x), self.b(x)], dim=1) * self.g1
        y = y.permute(0, 2, 3, 1) * self.g2
        return y.flatten(1, 2) * self.g3, torch.relu(self.b(x)) * -0.7


@pytest.mark.parametrize("mode", ["fixedpoint", "single"])
def test_mul_by_a_constant_per_channel_is_a_depthwise_qlinearconv(mode):
    g, x = quantized_graph(ChannelScales(), (2, 3, 6, 5))
    muls = [n.name for n in g.nodes if n.op == "Mul"]
    low = both(g, {g.inputs[0]: x}, mode)["qoperator"]
    assert len(muls) == 4 and all(low.lowering[m].startswith("QLinearConv, depthwise") for m in muls)
    x = np.concatenate([x, np.random.default_rng(7).standard_normal((64, 3, 6, 5)).astype(x.dtype) * 2])
    both(g, {g.inputs[0]: x}, mode)


class Movers(torch.nn.Module):
    """Ops that only move or select codes: DepthToSpace, Tile, nearest Resize, the
    Reshape / Transpose of pixel_unshuffle, GlobalMaxPool and ReduceMax."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.pixel_shuffle(torch.relu(self.conv(x)), 2).repeat(1, 2, 1, 1)
        y = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="nearest")
        y = torch.nn.functional.pixel_unshuffle(y, 4)
        return torch.amax(y, dim=(2, 3)) + torch.nn.functional.adaptive_max_pool2d(y, 1).flatten(1)


@pytest.mark.parametrize("mode", MODES)
def test_code_movers_lowered(mode):
    import npuforge

    torch.manual_seed(0)
    graph = npuforge.from_torch(Movers().eval(), torch.zeros(1, 3, 4, 4))
    rng = np.random.default_rng(346)
    q = npuforge.quantize(graph, [rng.standard_normal((4, 3, 4, 4)).astype(np.float32)], {"strict": True},
                          log=lambda m: None)
    assert {"DepthToSpace", "Tile", "Resize", "ReduceMax", "GlobalMaxPool"} <= set(q.op_histogram())
    x = q.values[q.inputs[0]].quant.quantize(rng.standard_normal((2, 3, 4, 4)).astype(np.float32))
    both(q, {q.inputs[0]: x}, mode)


@pytest.mark.parametrize("mode", MODES)
def test_global_and_windowed_pools_lowered(mode):
    rng = np.random.default_rng(350)
    g, x, *_ = pool_case(rng, "GlobalAveragePool", (2, 5, 7, 7))
    both(g, {"x": x}, mode)
    for attrs in POOLS:  # border windows count fewer elements (count_include_pad 0): one table per count
        g, x, *_ = pool_case(rng, "AveragePool", attrs={**attrs, "ceil_mode": 0, "dilations": [1, 1]})
        lows = both(g, {"x": x}, mode)
        assert "window sums" in lows["float"].lowering["n"]


def every_sum(p, count: int) -> np.ndarray:
    """uint8 codes [S, count]: row k sums (less the zero point) to the k-th of every sum ``count``
    codes of ``p`` can reach, in order (full rows, then one partial code, then the lowest)."""
    span = p.qmax - p.qmin
    above = np.arange(count * span + 1)  # each row's sum of q - qmin
    j = np.arange(count)
    rows = np.where(j < above[:, None] // span, span, np.where(j == above[:, None] // span, above[:, None] % span, 0))
    return (rows + p.qmin).astype(np.uint8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("x_zero", [0, 97])
@pytest.mark.parametrize("spatial", [(7, 7), (49,), (5, 5)])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "ReduceMean"])
def test_global_average_pool_on_every_sum(mode, x_zero, spatial, op):
    """QLinearGlobalAveragePool, for a GlobalAveragePool and a ReduceMean over the axes after the
    channels, where a float32 scale is proven on every sum (always for the onnx rounding; for the
    others here with an input after a Relu, zero point 0), else the float lowering's table: equal to
    the plain path on an input whose channels reach every sum the codes can."""
    rng = np.random.default_rng(360 + x_zero + len(spatial))
    count = int(np.prod(spatial))
    xp_, yp = qp("uint8", rng.uniform(0.005, 0.05), x_zero), qp("uint8", rng.uniform(0.004, 0.02), 3)
    x = every_sum(xp_, count)
    x = x.reshape(1, x.shape[0], *spatial)
    b = G()
    b.input("x", x.shape, xp_)
    inputs, attrs = ["x"], {}
    if op == "ReduceMean":
        inputs.append(b.const("axes", np.arange(2, x.ndim, dtype=np.int64)))
        attrs = {"keepdims": 1, "noop_with_empty_axes": 0}
    g = b.node(op, inputs, (*x.shape[:2],) + (1,) * len(spatial), yp, attrs,
               requant_ints(np.float64(xp_.scale) / np.float64(yp.scale)))
    lows = both(g, {"x": x}, mode)
    how = lows["qoperator"].lowering["n"]
    if mode == "onnx" or x_zero == 0:  # (sums of both signs: proven or not, equal all the same)
        assert how.startswith("QLinearGlobalAveragePool"), how
    assert len(np.unique(IntegerSimulator(g, mode).run({"x": x}, dequantize=False)["y"])) > 200


def test_reduce_mean_over_the_channels_runs_in_float():
    """A ReduceMean over the channel axis is no QLinearGlobalAveragePool."""
    xp_, yp = qp("uint8", 0.02, 0), qp("uint8", 0.01, 0)
    x = every_sum(xp_, 9).reshape(1, -1, 9)[:, :40].transpose(0, 2, 1).copy()  # [1, 9, 40]: channels summed
    b = G()
    b.input("x", x.shape, xp_)
    g = b.node("ReduceMean", ["x", b.const("axes", np.array([1], np.int64))], (1, 1, 40), yp,
               {"keepdims": 1, "noop_with_empty_axes": 0}, requant_ints(np.float64(2.0)))
    how = both(g, {"x": x}, "fixedpoint")["qoperator"].lowering["n"]
    assert how.startswith("in float"), how


def test_global_average_pool_with_no_scale_proven_runs_in_float(monkeypatch):
    """Where no candidate scale is proven (here: only one 100,000 ulps off), the float lowering's table."""
    from npuforge.sim import qoperator

    monkeypatch.setattr(qoperator, "POOL_NUDGES", (100_000,))
    xp_, yp = qp("uint8", 0.02, 0), qp("uint8", 0.01, 0)
    x = every_sum(xp_, 9).reshape(1, -1, 3, 3)
    b = G()
    b.input("x", x.shape, xp_)
    g = b.node("GlobalAveragePool", ["x"], (*x.shape[:2], 1, 1), yp, {}, requant_ints(np.float64(2.0)))
    how = both(g, {"x": x}, "fixedpoint")["qoperator"].lowering["n"]
    assert how.startswith("in float (no float32 scale reproduces its rounding)"), how


class Sums(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y.sum(dim=(2, 3), keepdim=True) + y.sum(dim=1, keepdim=True).mean(dim=(2, 3), keepdim=True)


@pytest.mark.parametrize("mode", MODES)
def test_reduce_sum_quantizes_as_a_pool_of_divisor_one(mode):
    import npuforge
    from npuforge.sim.fake_quant import run_fake_quant

    torch.manual_seed(0)
    graph = npuforge.from_torch(Sums().eval(), torch.zeros(1, 3, 6, 6))
    x = np.random.default_rng(352).standard_normal((4, 3, 6, 6)).astype(np.float32)
    q = npuforge.quantize(graph, [x], {"strict": True}, log=lambda m: None)
    assert q.op_histogram()["ReduceSum"] == 2
    step = float(q.values[q.outputs[0]].quant.scale)
    fake = run_fake_quant(q, {q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(fake - graph.run({graph.inputs[0]: x})[graph.outputs[0]]).max() <= 2 * step
    assert np.abs(IntegerSimulator(q, mode).run({q.inputs[0]: x})[q.outputs[0]] - fake).max() <= 1.01 * step
    both(q, {q.inputs[0]: q.values[q.inputs[0]].quant.quantize(x)}, mode)


def quantized_graph(module, example, seed=351, config=None, dynamic_batch=True):
    import npuforge

    torch.manual_seed(0)
    graph = npuforge.from_torch(module.eval(), torch.zeros(*example), dynamic_batch=dynamic_batch)
    x = np.random.default_rng(seed).standard_normal((4, *example[1:])).astype(np.float32)
    q = npuforge.quantize(graph, [x], config, log=lambda m: None)
    return q, q.values[q.inputs[0]].quant.quantize(x)


def int16_graph():
    """A quantized graph with an int16 Gemm output: its requantization to 65536 levels is
    beyond the float formulas' proof."""
    return quantized_graph(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4)),
                           (2, 8), config={"int16": ["/0/Gemm"]})


@pytest.mark.parametrize("mode", ["fixedpoint", "single"])
def test_an_int16_layer_is_proven_on_its_reachable_steps_and_runs_beside_uint8_integer_operators(mode):
    """The int16 Gemm's accumulators reach a few hundred of its 65536 output steps: the proof
    walks those, a float formula holds, and the uint8 layers around it stay ONNX Runtime's own
    integer operators (the int16 value lives as a float copy between them)."""
    g, x = int16_graph()
    lows = both(g, {g.inputs[0]: x}, mode)
    assert lows["qoperator"].lowering["/0/Gemm"].startswith("in float (an operand that is not uint8): float")
    assert lows["qoperator"].lowering["/2/Gemm"].startswith("in float (an operand that is not uint8)")


def test_an_int16_graph_output_leaves_onnx_runtimes_integer_operators_as_int16_codes():
    """A detector's box decoding in int16 at the end of a uint8 network: the network stays ONNX
    Runtime's integer operators and the int16 output comes out as its codes (it was refused, and
    the whole graph ran in the slower float lowering)."""
    g, x = quantized_graph(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4)),
                           (2, 8), config={"int16": ["/2/Gemm"]})
    assert g.values[g.outputs[0]].quant.dtype == "int16"
    for mode in ("fixedpoint", "single"):
        low = both(g, {g.inputs[0]: x}, mode)["qoperator"]
        assert low.lowering["/0/Gemm"].startswith("QLinearConv")


def test_nodes_kept_in_float_lower_when_asked_and_agree_with_the_plain_path():
    """float_nodes=True: a layer kept in float (here the first, reading the float input, and
    the last, writing the float output) runs in ONNX Runtime's float kernels between a
    dequantization and the quantizer's rounding; without it the graph is refused by name.
    Float kernels may sum in another order than torch's, so a code at a rounding boundary
    may differ: on this small model none does. Two adjacent layers in float keep the rounding
    between them (ONNX Runtime's QDQ optimizers, which would drop a QuantizeLinear ->
    DequantizeLinear pair, are off)."""
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1),
                                 torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5))
    import npuforge

    torch.manual_seed(0)
    graph = npuforge.from_torch(module.eval(), torch.zeros(2, 3, 8, 8))
    x = np.random.default_rng(5).standard_normal((4, 3, 8, 8)).astype(np.float32)
    for keep in (["/0/Conv"], ["/2/Conv"], ["/5/Gemm"], ["/0/Conv", "/2/Conv"]):
        g = npuforge.quantize(graph, [x], {"keep_float": keep}, log=lambda m: None)
        with pytest.raises(UnsupportedError, match="it runs in float"):
            LoweredSimulator(g, "fixedpoint")
        want = IntegerSimulator(g, "fixedpoint").run({g.inputs[0]: x})
        for form in ("qoperator", "float"):
            low = LoweredSimulator(g, "fixedpoint", form=form, float_nodes=True)
            assert all(low.lowering[k].startswith("in float (kept in float by the quantizer)") for k in keep)
            got = low.run({g.inputs[0]: x})
            for name in g.outputs:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"{keep} {form}")


def test_per_channel_saturation_bounds_stay_integer_operators():
    """Equalization gives each channel of a fused Relu6 its own saturation codes: Max / Min with
    per-channel bounds after ONNX Runtime's QLinearConv, equal to the plain path."""
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU6(), torch.nn.Conv2d(8, 8, 3, groups=8),
                                 torch.nn.ReLU6(), torch.nn.Conv2d(8, 4, 1))
    g, x = quantized_graph(module, (2, 3, 10, 10), config={"equalize": True})
    conv = next(n for n in g.nodes if n.name == "/0/Conv")
    lo, hi = IntegerSimulator(g, "fixedpoint")._prep_compute(conv)["bounds"]
    assert not isinstance(hi, int)  # per-channel bounds, the case under test
    lows = both(g, {g.inputs[0]: x}, "fixedpoint")
    assert lows["qoperator"].lowering["/0/Conv"].startswith("QLinearConv")


class Normalized(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.Linear(7, 7)
        self.inorm, self.lnorm = torch.nn.InstanceNorm2d(6, affine=True), torch.nn.LayerNorm(7)

    def forward(self, x):
        return torch.nn.functional.normalize(self.lnorm(self.fc(self.inorm(self.conv(x)))), dim=(1, 3))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ["float64", "float64 with c", "int64 output", "int64"])
def test_layer_and_instance_norm_lowered(mode, path, monkeypatch):
    """float64: D = N sum(x^2) - S^2 + E, r = floor(2^30 / sqrt(D_h)), u = floor(x N r / 2^(h + down) -
    S r / 2^(h + down)) and the output sum u G + B, each below 2^53 (every model here; S and sum(x^2) in
    float32 where they stay below 2^24). float64 with c (N m past 2^23: int16 rows of a few hundred):
    D = sum(c^2) / N + E and u = floor(c r / 2^(h + down)). int64 output: G with the 24 fractional bits
    an IR quantized before the rule kept that sum below 2^53 carries (the sum past it: in int64, its
    division's result cast from uint64 to float32). int64 (bounds made huge: slices of 185,000 int16
    codes would need it): D from the int64 sums, r by the corrected integer square root, c r in int64."""
    from npuforge.quant import layernorm_rule
    from npuforge.sim import lowered_int64

    if path == "float64 with c":
        monkeypatch.setattr(lowered_int64, "ROWS_BELOW", 0)
    if path == "int64 output":
        monkeypatch.setattr(layernorm_rule, "FLOAT64_MIN_F", 25)
    if path == "int64":
        monkeypatch.setattr(lowered_int64, "R_ABOVE_SHIFT", 1 << 40)
        monkeypatch.setattr(lowered_int64, "FLOAT64_INTEGERS", 0)
        monkeypatch.setattr(lowered_int64, "FLOAT32_INTEGERS", 0)
    # 8-bit inputs, whatever the narrowest of the 7-element rows (int16 ones have no lowering)
    g, x = quantized_graph(Normalized(), (2, 3, 5, 7), config={"norm_spread_codes": 0})
    lows = both(g, {g.inputs[0]: x}, mode)
    how = "float64 normalization" if path.startswith("float64") else "int64 normalization"
    assert list(lows["float"].lowering.values()).count(how) == 3
    # slices of 96 x 96 positions: variances past 2^23, so the per-slice shift h > 0 is taken
    wide = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3, padding=1), torch.nn.InstanceNorm2d(2, affine=True))
    g, x = quantized_graph(wide, (2, 3, 96, 96))
    from npuforge.quant.layernorm_rule import shift_of

    plain = IntegerSimulator(g, mode)
    node = next(n for n in g.nodes if n.op == "InstanceNormalization")
    codes = plain.run({g.inputs[0]: x}, outputs=[node.inputs[0]], dequantize=False)[node.inputs[0]]
    q = torch.from_numpy(codes.astype(np.int64))
    n, total = q.shape[2] * q.shape[3], q.sum(dim=(2, 3), keepdim=True)
    assert (shift_of(n * (q * q).sum(dim=(2, 3), keepdim=True) - total * total) > 0).all()
    both(g, {g.inputs[0]: x}, mode)
    # rows of 128 features (a small transformer's), h > 0 with D in float64; r itself is the rule's (an r one
    # off changes an output code rarely enough for a few hundred rows to miss it)
    g, x = quantized_graph(torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.LayerNorm(128)), (4, 64, 16))
    node = next(n for n in g.nodes if n.op == "LayerNormalization")
    q = torch.from_numpy(IntegerSimulator(g, mode).run({g.inputs[0]: x}, outputs=[node.inputs[0]],
                                                       dequantize=False)[node.inputs[0]].astype(np.int64))
    d = 128 * (q * q).sum(dim=-1, keepdim=True) - q.sum(dim=-1, keepdim=True) ** 2 + \
        int(IntegerSimulator(g, mode)._int(node, "epsilon"))
    assert (shift_of(d) > 0).float().mean() > 0.5
    low = both(g, {g.inputs[0]: x}, mode)["float"]
    assert low.lowering[node.name] == how
    want = [math.isqrt((1 << 60) // (int(v) >> 2 * int(shift_of(v)))) for v in d.flatten()]
    np.testing.assert_array_equal(np.ravel(intermediate(low, {g.inputs[0]: x}, f"{node.name}::r")), want)
    # an L2Normalize over the channels alone: its sums [N, 1, H, W] meet the shift limits on a new axis
    g, x = quantized_graph(ChannelNormalized(), (2, 3, 5, 7))
    assert "L2Normalize" in g.op_histogram()
    assert how in both(g, {g.inputs[0]: x}, mode)["float"].lowering.values()


def intermediate(low, feeds: dict, name: str) -> np.ndarray:
    """A value inside a float-form lowered simulator's ONNX program, on ``feeds`` of codes of its graph's inputs."""
    import onnxruntime as ort

    from npuforge.sim.lowered import DISABLED_OPTIMIZERS

    model = onnx.ModelProto()
    model.CopyFrom(low.model)
    model.graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"],
                                   disabled_optimizers=DISABLED_OPTIMIZERS)
    zps = {k: np.float32(int(low.graph.values[k].quant.zero_point)) for k in feeds}
    return session.run([name], {k: np.asarray(v).astype(np.float32) - zps[k] for k, v in feeds.items()})[0]


class ChannelNormalized(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        return torch.nn.functional.normalize(self.conv(x), dim=1)


class Attention(torch.nn.Module):
    """Q K^T and its softmax times V: MatMuls of two activations, inner dimensions 8 and 6
    (float32 accumulators) and, with ``wide``, 1100 (past 2^24 even at zero points near 128)."""

    def __init__(self, wide: bool = False):
        super().__init__()
        d = 1100 if wide else 8
        self.q, self.k, self.v = (torch.nn.Linear(4, d) for _ in range(3))

    def forward(self, x):
        att = torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1), dim=-1)
        return att @ self.v(x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wide", [None, "int32", "float64"])
def test_matmul_of_two_activations_is_lowered(mode, wide, monkeypatch):
    """Accumulators past float32's 2^24 as exact int32 sums of the codes' bytes (u8u8 MatMulInteger),
    or (where the codes are not bytes: made so here) in float64."""
    if wide == "float64":
        from npuforge.sim import lowered

        monkeypatch.setattr(lowered, "BYTE_CODES", ())
    g, x = quantized_graph(Attention(wide is not None), (2, 6, 4))
    lows = both(g, {g.inputs[0]: x}, mode)
    how = [v for v in lows["float"].lowering.values() if v.startswith("matmul of activations")]
    assert sorted(v.split(", ")[1] for v in how) == ["float32 product", f"{wide or 'float32'} product"], how
    if wide is None:
        # the qoperator form: QLinearMatMul, its u8u8 product exact, its float32 scale proven
        matmuls = [n.name for n in g.nodes if n.op == "MatMul" and not g.values[n.inputs[1]].is_const]
        assert [lows["qoperator"].lowering[n] for n in matmuls] == ["QLinearMatMul (its float32 scale proven on "
                                                                    "every accumulator)"] * 2


class ClassToken(torch.nn.Module):
    """A ViT's class token: a constant concatenated before the tokens, on their grid."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 8) * 0.5)

    def forward(self, x):
        return self.head(torch.cat([self.cls.expand(x.shape[0], -1, -1), self.embed(x)], dim=1))


@pytest.mark.parametrize("mode", MODES)
def test_concat_with_a_constant_input_is_lowered(mode):
    g, x = quantized_graph(ClassToken(), (4, 6, 4), dynamic_batch=False)  # the Expand folds to a constant
    concat = next(n for n in g.nodes if n.op == "Concat")
    assert any(g.values[i].is_const for i in concat.inputs)
    lows = both(g, {g.inputs[0]: x}, mode)
    assert lows["float"].lowering[concat.name] == "moves codes"


class PositionEmbedding(torch.nn.Module):
    """An Add of 38,400 constant elements (a table of 256 per element would hold 9.8 M)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 192)
        self.pos = torch.nn.Parameter(torch.randn(1, 200, 192) * 0.5)

    def forward(self, x):
        return self.embed(x) + self.pos


@pytest.mark.parametrize("mode", MODES)
def test_add_of_a_large_constant_is_lowered_by_its_distinct_codes(mode):
    g, x = quantized_graph(PositionEmbedding(), (2, 200, 4))
    add = next(n for n in g.nodes if n.op == "Add" and n.outputs[0] in g.outputs)  # the embedding's
    lows = both(g, {g.inputs[0]: x}, mode)
    assert "distinct codes" in lows["float"].lowering[add.name]
    assert not any("distinct_codes" in name for name in g.values)  # the graph is left as it was


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", ["float64", "int64", "float64 row tables"])
def test_softmax_lowered_exactly(mode, form, monkeypatch):
    """In float64 where the rule's numerator stays below 2^53, else (the bound made 0 here) in int64;
    rows of 2 L entries or more (L = 256 input codes) as a table of outputs per row, on the last
    axis or another (the threshold lowered to 1 L here, so rows of 400 take it too)."""
    from npuforge.sim import lowered_int64

    if form == "int64":
        monkeypatch.setattr(lowered_int64, "FLOAT64_INTEGERS", 0)
    if form == "float64 row tables":
        monkeypatch.setattr(lowered_int64, "ROW_TABLE_MIN", 1)
    lowered = []
    for axis, shape in ((-1, (3, 4)), (1, (3, 4)), (-1, (3, 400)), (-2, (3, 400)), (-1, (3, 600)), (1, (600, 3))):
        rows = shape[0] * shape[1]
        g, x = quantized_graph(torch.nn.Sequential(torch.nn.Linear(8, rows), torch.nn.Unflatten(1, shape),
                                                   torch.nn.Softmax(axis)), (2, 8))
        x = np.concatenate([x, np.random.default_rng(rows).standard_normal((64, 8)).astype(x.dtype) * 3])
        lowered += both(g, {g.inputs[0]: x}, mode)["float"].lowering.values()
    want = {"float64": ["float64 softmax", "float64 softmax, a table per row"], "int64": ["int64 softmax"],
            "float64 row tables": ["float64 softmax", "float64 softmax, a table per row"]}[form]
    assert all(w in lowered for w in want), lowered
    if form == "float64 row tables":  # rows of 400 and 600, on the last axis and on the middle one
        assert lowered.count("float64 softmax, a table per row") == 3
        monkeypatch.setattr(lowered_int64, "INT32_SUMS", 600 * 2**16)  # rows whose int32 sum could overflow: none
        assert "float64 softmax, a table per row" not in both(g, {g.inputs[0]: x}, mode)["float"].lowering.values()


@pytest.mark.parametrize("mode", MODES)
def test_a_requantization_no_float_formula_reproduces_runs_in_int64_or_falls_back_by_name(mode, monkeypatch):
    """An int16 Gemm output whose reachable steps are beyond the float formulas' proof (the limits
    lowered here so a small layer has too many): the fixed-point modes run its requantization
    step for step in int64; the onnx mode's rule is float arithmetic, which has no int64 form,
    and falls back to the plain path, by name."""
    import npuforge.sim.monotone_fit as monotone_fit

    monkeypatch.setattr(monotone_fit, "MAX_LEVELS", 8)
    monkeypatch.setattr(monotone_fit, "MAX_CELLS", 0)
    g, x = int16_graph()
    if mode == "onnx":
        with pytest.raises(UnsupportedError, match="node '/0/Gemm' \\(Gemm\\)"):
            LoweredSimulator(g, mode)
        assert isinstance(make_simulator(g, mode), IntegerSimulator)
        with pytest.raises(UnsupportedError):
            make_simulator(g, mode, engine="ort")
        return
    low = make_simulator(g, mode, engine="ort")
    assert low.lowering["/0/Gemm"].endswith("int64 fixed-point (no float formula proven)")
    for k in (1, 4, 30):  # 30: most outputs clamped
        feeds = {g.inputs[0]: x * k}
        want, got = IntegerSimulator(g, mode).run(feeds, dequantize=False), low.run(feeds, dequantize=False)
        assert all(np.array_equal(got[n], want[n]) for n in g.outputs)


class WideElementwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 6), torch.nn.Linear(8, 6)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        return a + b, a * b, a - b, a * 0.37 + 0.5, a * a, a + torch.linspace(-1, 1, 6), b - a


@pytest.mark.parametrize("tflite", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_int16_add_sub_mul_lowered_in_int64(mode, tflite):
    """Add / Sub / Mul with an int16 operand (the values of one Gemm kept in int16): no table of
    every pair of codes. npuforge's Add / Sub rescales each operand alone: a table per operand
    (a constant: its values), summed and rounded in float64; Mul and TFLite's ADD (with
    tflite_multipliers) run step for step in int64; onnx falls back."""
    g, x = quantized_graph(WideElementwise(), (2, 8), config={"int16": ["/a/Gemm"], "tflite_multipliers": tflite})
    assert ("multiplierout" in next(n for n in g.nodes if n.name == "/Add").quant) == tflite
    if mode == "onnx":
        with pytest.raises(UnsupportedError, match="wider than 8 bits|QLinearAdd|no float formula"):
            LoweredSimulator(g, mode)
        return
    low = make_simulator(g, mode, engine="ort")
    hows = list(low.lowering.values())
    computed = sum("int16 operands rescaled in float64" in how for how in hows)
    assert (computed, sum("int64 fixed-point" in how for how in hows) >= (6 if tflite else 2)) == \
        (0 if tflite else 4, True), low.lowering  # (a + b, a - b, a + a constant, b - a)
    info, rng = np.iinfo(x.dtype), np.random.default_rng(5)
    # 20,000 rows: ties of RoundingDivideByPOT (one sum in 2^14 here) in both signs
    for codes in (x, rng.integers(info.min, info.max + 1, (20000, 8)).astype(x.dtype)):
        feeds = {g.inputs[0]: codes}
        want, got = IntegerSimulator(g, mode).run(feeds, dequantize=False), low.run(feeds, dequantize=False)
        assert all(np.array_equal(got[n], want[n]) for n in g.outputs)


class TokenModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.norm, self.fc = torch.nn.Embedding(50, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 4)

    def forward(self, ids):
        return self.fc(self.norm(self.embed(ids.reshape(-1, 3, 2).flatten(1))))


@pytest.mark.parametrize("mode", ["fixedpoint", "single"])
def test_token_id_inputs_lowered(mode):
    """int64 token ids: the reshape of the ids runs as it is, the embedding lookup gathers the
    table's codes, in the form of ONNX Runtime's integer operators (it took the float form for any
    int64 input); the lowered engine equals the plain path, nothing falls back."""
    import npuforge

    torch.manual_seed(0)
    ids = np.random.default_rng(3).integers(0, 50, (4, 6))
    g = npuforge.from_torch(TokenModel().eval(), torch.from_numpy(ids))
    q = npuforge.quantize(g, [{g.inputs[0]: ids}], log=lambda m: None)
    low = make_simulator(q, mode)
    assert isinstance(low, LoweredSimulator) and low.form == "qoperator", low
    assert "Gather of the table's codes" in low.lowering.values()
    for seed in range(3):
        feeds = {q.inputs[0]: np.random.default_rng(seed).integers(0, 50, (5, 6))}
        want, got = IntegerSimulator(q, mode).run(feeds, dequantize=False), low.run(feeds, dequantize=False)
        assert all(np.array_equal(got[n], want[n]) for n in q.outputs)


@pytest.mark.parametrize("mode", MODES)
def test_conv_transpose_lowered(mode):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                              torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1))
    g, x = quantized_graph(net, (2, 3, 6, 5))
    low = make_simulator(g, mode, engine="ort")
    assert "ConvTranspose" in {n.op_type for n in low.model.graph.node}
    info, rng = np.iinfo(x.dtype), np.random.default_rng(2)
    for codes in (x, rng.integers(info.min, info.max + 1, (3, 3, 6, 5)).astype(x.dtype)):
        feeds = {g.inputs[0]: codes}
        want, got = IntegerSimulator(g, mode).run(feeds, dequantize=False), low.run(feeds, dequantize=False)
        assert all(np.array_equal(got[n], want[n]) for n in g.outputs)


class TwoReaders(torch.nn.Module):
    """One value read by two Convs whose accumulators pass 2^24."""

    def __init__(self, width: int, kernel: int, readers: str = ""):
        super().__init__()
        self.first = torch.nn.Conv2d(3, width, kernel, padding=kernel // 2)
        if readers == "grouped":  # a depthwise one, and one of groups of 4 channels
            self.a, self.b = (torch.nn.Conv2d(width, width // k, 3, padding=1, groups=width // k) for k in (1, 4))
        else:
            k = 1 if readers == "pointwise" else 3
            self.a, self.b = (torch.nn.Conv2d(width, 8 * width // 32, k, padding=k // 2) for _ in range(2))

    def forward(self, x):
        y = self.first(x)
        return self.a(y), self.b(y)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("dtype", ["int16", "int16 grouped", "int16 pointwise", "int8", "int8 pointwise"])
def test_conv_of_wide_accumulators_on_int16_and_int8_inputs_lowered(dtype, signed, monkeypatch):
    """A Conv whose accumulators pass 2^24: ONNX Runtime's u8u8 ConvInteger on the input's codes
    (int8 moved up by 128; int16 split into two bytes, one ConvInteger each, summed in float64);
    a pointwise one as MatMulInteger of the weights by the input's rows (u8s8 where the CPU sums
    those exactly, else u8u8); a grouped one of int16 input as two float32 Convs of the bytes (each
    exact), summed in float64; the input's copies are made once for its two readers."""
    from npuforge.sim import qoperator

    exact = qoperator.signed_weights_exact()
    monkeypatch.setattr(qoperator, "signed_weights_exact", lambda: signed)
    kind, _, readers = dtype.partition(" ")
    net, config = (TwoReaders(32, 3, readers), {"int16": ["/first/Conv"]}) if kind == "int16" else \
        (TwoReaders(2304 if readers else 256, 1, readers), {"activation_dtype": "int8"})
    g, x = quantized_graph(net, (2, 3, 6, 5), config=config)
    assert g.values[g.nodes[1].inputs[0]].quant.dtype == kind
    low = make_simulator(g, "fixedpoint", engine="ort")
    # int8 activations: the float form; an int16 layer among uint8 ones: in float within the integer operators
    assert low.form == ("float" if kind == "int8" else "qoperator")
    ops = [n.op_type for n in low.model.graph.node]
    parts = 2 * (2 if kind == "int16" else 1)  # two readers, two bytes of an int16 input
    assert (ops.count("ConvInteger"), ops.count("MatMulInteger"), ops.count("Conv")) == \
        {"": (parts, 0, 1), "grouped": (0, 0, 5), "pointwise": (0, parts, 1)}[readers]  # the first Conv: float32
    if readers == "pointwise":
        types = {n.output[0]: n.attribute[0].i for n in low.model.graph.node if n.op_type == "Cast"}
        signed_rows = [types.get(n.input[0]) == onnx.TensorProto.INT8 for n in low.model.graph.node
                       if n.op_type == "Reshape" and "x_rows" in n.output[0]]
        assert len(signed_rows) == parts and set(signed_rows) == {signed}
    if signed and not exact:  # (ONNX Runtime's u8s8 pair sums saturate on this CPU)
        return
    info, rng = np.iinfo(x.dtype), np.random.default_rng(9)
    for codes in (x, rng.integers(info.min, info.max + 1, (3, 3, 6, 5)).astype(x.dtype)):
        feeds = {g.inputs[0]: codes}
        want, got = IntegerSimulator(g, "fixedpoint").run(feeds, dequantize=False), low.run(feeds, dequantize=False)
        assert all(np.array_equal(got[n], want[n]) for n in g.outputs)


class Upsample(torch.nn.Module):
    def __init__(self, size, align):
        super().__init__()
        self.conv, self.size, self.align = torch.nn.Conv2d(3, 4, 3), size, align

    def forward(self, x):
        return torch.nn.functional.interpolate(self.conv(x), size=self.size, mode="bilinear",
                                               align_corners=self.align)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("size,align", [((11, 7), False), ((3, 16), True), ((4, 4), False), ((12, 14), False)])
def test_integer_bilinear_resize_lowered_in_int64(size, align, dtype):
    """Up, down and mixed sizes, half-pixel and align-corners coordinates, uint8 and int8 grids (x2:
    the weights 1/4 and 3/4 make ties of both signs, rounded half away from zero)."""
    g, x = quantized_graph(Upsample(size, align), (4, 3, 8, 9), config={"activation_dtype": dtype},
                           dynamic_batch=False)
    assert any(IntegerSimulator(g)._kind(n) == "interpolate" for n in g.nodes)
    low = make_simulator(g, "fixedpoint", engine="ort")
    assert "float64 bilinear" in str(low.lowering)
    info, rng = np.iinfo(x.dtype), np.random.default_rng(4)
    for codes in (x, rng.integers(info.min, info.max + 1, (4, 3, 8, 9)).astype(x.dtype)):
        feeds = {g.inputs[0]: codes}
        want, got = IntegerSimulator(g, "fixedpoint").run(feeds, dequantize=False), low.run(feeds, dequantize=False)
        assert all(np.array_equal(got[n], want[n]) for n in g.outputs)


@pytest.mark.parametrize("single", [False, True])
def test_int64_requantization_equals_the_plain_rules_on_extreme_accumulators(single):
    """lowered_int64.requantize against int_ops.requantize_fixedpoint / requantize_single on
    accumulators at and beyond int32's ends, per channel: left shifts (saturating), no shift, and
    right shifts of 1 to 31 bits (rounding half away from zero, the negative side included)."""
    import onnxruntime as ort
    from onnx import helper, TensorProto

    from npuforge.sim import lowered_int64
    from npuforge.sim.int_ops import requantize_fixedpoint, requantize_single
    from npuforge.sim.lowering_base import LoweringBuilder

    rng = np.random.default_rng(7)
    shifts = np.arange(-31, 1 if single else 5, dtype=np.int64)
    mult = rng.integers(1 << 30, 1 << 31, shifts.size, dtype=np.int64)
    mult[:3] = [(1 << 31) - 1, 1 << 30, 1]
    edges = np.array([-(2**31) - 5, -(2**31), -(2**31) + 1, -(2**30) - 1, -(2**30), -1, 0, 1, 2**30, 2**31 - 1,
                      2**31 + 7], np.int64)
    acc = np.concatenate([np.broadcast_to(edges[:, None], (edges.size, shifts.size)),
                          rng.integers(-(2**33), 2**33, (500, shifts.size)),
                          rng.integers(-(2**12), 2**12, (500, shifts.size))]).astype(np.int64)

    class Builder(LoweringBuilder):
        def __init__(self):  # no graph: the emitter only needs emit and const
            self.nodes, self.inits, self._consts, self._made = [], [], set(), set()

    b = Builder()
    out = lowered_int64.requantize(b, "acc", mult, shifts, single, [1, -1], "rq")
    model = helper.make_model(helper.make_graph(
        b.nodes, "rq", [helper.make_tensor_value_info("acc", TensorProto.INT64, list(acc.shape))],
        [helper.make_tensor_value_info(out, TensorProto.INT64, list(acc.shape))], b.inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"acc": acc})[0]
    rule = requantize_single if single else requantize_fixedpoint
    want = rule(torch.from_numpy(acc), torch.from_numpy(mult)[None], torch.from_numpy(shifts)[None]).numpy()
    assert np.array_equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wide", [False, True])
def test_conv_with_fused_leaky_relu_lowered(mode, wide):
    """Each side of zero gets its own proven formula; Where picks by the accumulator's sign."""
    rng = np.random.default_rng(352)
    g, x, *_ = conv_case(rng, act="LeakyRelu", act_params=(0.1,), **({"cin": 256, "hw": (4, 3)} if wide else {}))
    lows = both(g, {"x": x}, mode)
    assert "LeakyRelu" in lows["float"].lowering["n"]


def test_lut_and_code_movers_lowered():
    from npuforge.ir.graph import Graph, Node, Value

    xp_, yp = qp("uint8", 0.06, 130), qp("uint8", 1.0 / 256, 0)
    x = np.arange(256, dtype=np.uint8).reshape(4, 1, 8, 8)
    table = yp.quantize(torch.sigmoid(torch.from_numpy(xp_.dequantize(np.arange(256)))).numpy())
    g = Graph("chain")
    g.add_value(Value("x", "float32", x.shape, quant=xp_))
    g.inputs = ["x"]
    for name, shape in (("s", (4, 1, 8, 8)), ("m", (4, 1, 4, 4)), ("c", (4, 2, 4, 4)), ("f", (4, 32))):
        g.add_value(Value(name, "float32", shape, quant=yp))
    g.add_const("lut", table)
    pool = {"ceil_mode": 0, "dilations": [1, 1], "kernel_shape": [2, 2], "pads": [0, 0, 0, 0], "strides": [2, 2],
            "storage_order": 0}
    g.nodes = [Node("sig", "Sigmoid", ["x"], ["s"], {}, {"lut": "lut"}),
               Node("pool", "MaxPool", ["s"], ["m"], pool),
               Node("cat", "Concat", ["m", "m"], ["c"], {"axis": 1}),
               Node("flat", "Flatten", ["c"], ["f"], {"axis": 1})]
    g.outputs = ["f", "s"]
    for mode in MODES:
        both(g, {"x": x}, mode)


@pytest.mark.parametrize("op", ["Relu", "LeakyRelu", "Sigmoid"])
def test_lookup_ops_run_in_onnx_runtimes_table_kernels_only_where_their_tables_equal(op):
    """A Relu / LeakyRelu / Sigmoid lookup runs as QLinearLeakyRelu / QLinearSigmoid, which map each
    code through a table they compute, where that table equals the plain path's on all 256 codes;
    a table one entry off runs as Gather from the plain table. Codes equal the plain path's."""
    from npuforge.ir.graph import Graph, Node, Value

    f = {"Relu": torch.relu, "LeakyRelu": lambda t: torch.nn.functional.leaky_relu(t, 0.1),
         "Sigmoid": torch.sigmoid}[op]
    xp_ = qp("uint8", 0.05, 120)
    yp = qp("uint8", 1.0 / 256 if op == "Sigmoid" else 0.03, 40 if op == "LeakyRelu" else 0)
    x = np.arange(256, dtype=np.uint8).reshape(4, 1, 8, 8)
    table = yp.quantize(f(torch.from_numpy(xp_.dequantize(np.arange(256)))).numpy())
    for off_by_one in (False, True):
        g = Graph("lookup")
        g.add_value(Value("x", "float32", x.shape, quant=xp_))
        g.add_value(Value("y", "float32", x.shape, quant=yp))
        lut = table.copy()
        lut[200] += np.uint8(off_by_one) * (1 if lut[200] < 255 else -1)
        g.add_const("lut", lut)
        g.inputs, g.outputs = ["x"], ["y"]
        g.nodes = [Node("t", op, ["x"], ["y"], {"alpha": 0.1} if op == "LeakyRelu" else {}, {"lut": "lut"})]
        how = both(g, {"x": x}, "fixedpoint")["qoperator"].lowering["t"]
        assert how.startswith("QLinear") != off_by_one, how


def test_make_simulator_engines():
    rng = np.random.default_rng(360)
    g, x, *_ = conv_case(rng)
    assert isinstance(make_simulator(g, "fixedpoint"), LoweredSimulator)
    assert isinstance(make_simulator(g, "fixedpoint", "plain"), IntegerSimulator)
    from npuforge.errors import NpuforgeError

    with pytest.raises(NpuforgeError, match="engine 'gpu'"):
        make_simulator(g, "fixedpoint", "gpu")
    # float inputs are quantized and outputs dequantized as the plain path does
    xf = g.values["x"].quant.dequantize(x)
    np.testing.assert_array_equal(make_simulator(g).run({"x": xf})["y"], IntegerSimulator(g).run({"x": xf})["y"])


def gemm_case(seed, batch=3, n=10, k=40, y_scale=0.05):
    """A Gemm (transB, weight [N, K], int32 bias) on uint8 activations."""
    rng = np.random.default_rng(seed)
    xp_, yp = qp("uint8", 0.02, 120), qp("uint8", y_scale, 128)
    wq = rng.integers(-127, 128, (n, k)).astype(np.int8)
    ws = np.float32(0.004)
    bias = rng.integers(-5000, 5000, n).astype(np.int32)
    x = rng.integers(0, 256, (batch, k)).astype(np.uint8)
    b = G()
    b.input("x", x.shape, xp_)
    from npuforge.quant.params import QParams

    b.const("w", wq.astype(np.float32) * ws, QParams("int8", np.float32(ws), np.int32(0)))
    b.const("bias", bias.astype(np.float32) * np.float32(0.02 * ws))
    g = b.node("Gemm", ["x", "w", "bias"], (batch, n), yp,
               {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1, "activation": "", "activation_params": []},
               {"weight": wq, "bias": bias, **requant_ints(0.02 * float(ws) / y_scale)})
    return g, x


def test_gemm_lowered_equals_plain():
    g, x = gemm_case(370)
    for mode in MODES:
        both(g, {"x": x}, mode)


def test_cli_sim_engine(tmp_path, capsys, monkeypatch):
    """npuforge run --sim-engine: each engine writes the same outputs; ort on a node it
    cannot lower is a one-line error naming the node (exit 2)."""
    import npuforge
    import npuforge.sim.monotone_fit as monotone_fit
    from npuforge.cli import main

    rng = np.random.default_rng(380)
    g, x, *_ = conv_case(rng)
    npuforge.save(g, tmp_path / "q.nfir")
    np.save(tmp_path / "x.npy", x)
    outs = {}
    for engine in ("auto", "ort", "plain"):
        out = tmp_path / f"{engine}.npz"
        assert main(["run", str(tmp_path / "q.nfir"), "--input", str(tmp_path / "x.npy"), "--mode", "int", "--codes",
                     "--sim-engine", engine, "--output", str(out)]) == 0
        outs[engine] = np.load(out)["y"]
    np.testing.assert_array_equal(outs["auto"], outs["plain"])
    np.testing.assert_array_equal(outs["ort"], outs["plain"])
    g, x = int16_graph()  # with its proof's limits lowered: a node with no lowering in the onnx rounding
    monkeypatch.setattr(monotone_fit, "MAX_LEVELS", 8)
    monkeypatch.setattr(monotone_fit, "MAX_CELLS", 0)
    npuforge.save(g, tmp_path / "p.nfir")
    np.save(tmp_path / "xp.npy", x)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "p.nfir"), "--input", str(tmp_path / "xp.npy"), "--mode", "int",
                 "--rounding", "onnx", "--sim-engine", "ort"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node '/0/Gemm' (Gemm)" in err[0] and "Traceback" not in err[0]


# -- multipliers ONNX Runtime's QLinearConv reproduces (npuforge/quant/ort_multipliers.py) -----


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), e=st.integers(0, 8), zp=st.integers(0, 255), nudge=st.integers(-3, 3))
def test_multiplier_interval_holds_exactly_the_matching_multipliers(seed, e, zp, nudge):
    """[L, U] from multiplier_interval holds exactly the multipliers whose fixed-point rule
    equals ONNX Runtime's float32 rule with scale s on *every* accumulator of the domain
    (checked exhaustively, on both sides of the interval's ends)."""
    from npuforge.quant.ort_multipliers import fixedpoint_rule, multiplier_interval
    from npuforge.sim.monotone_fit import Formula, float32_nudged, thresholds

    rng = np.random.default_rng(seed)
    c = 3
    # normalized multipliers when there is a right shift (the interval assumes x M < -2^30 for x < 0)
    mult = rng.integers(2**30 + 1 if e else 2**27, 2**31, c).astype(np.int64)
    ee = np.full(c, e, np.int64)
    lo, hi = np.full(c, -zp, np.int64), np.full(c, 255 - zp, np.int64)
    a = rng.integers(-30000, 0, c).astype(np.int64)
    b = a + rng.integers(1, 60000, c)
    formula = Formula(float32_nudged(mult * 2.0 ** (-31 - ee), nudge), rnd="round")
    levels = lo[:, None] + 1 + np.arange(255)[None, :]
    valid = np.ones(levels.shape, bool)
    ort = lambda acc: formula.evaluate(acc, lo[:, None], hi[:, None])  # noqa: E731
    t = thresholds(ort, a, b, levels, formula.steps(levels))
    lower, upper = multiplier_interval(t, levels, a, b, ee, valid)
    for i in range(c):
        acc = np.arange(a[i], b[i] + 1)[None, :]
        row = Formula(formula.r[i:i + 1], rnd="round")
        want = row.evaluate(acc, lo[i], hi[i])
        probe = {lower[i] - 1, lower[i], (lower[i] + upper[i]) // 2, upper[i], upper[i] + 1} \
            if lower[i] <= upper[i] else {mult[i] - 1, mult[i], mult[i] + 1}
        for m in sorted(p for p in probe if (2**30 + 1 if e else 0) <= p < 2**31):
            got = fixedpoint_rule(np.array([m]), ee[i:i + 1], lo[i:i + 1], hi[i:i + 1])(acc)
            assert np.array_equal(got, want) == (lower[i] <= m <= upper[i]), (i, m, lower[i], upper[i])


def test_a_conv_of_a_constant_input_keeps_multipliers_and_runs():
    """A Conv after a dead layer sees one accumulator value: its outputs take no step, so every
    multiplier matches ONNX Runtime's rule (the quantizer's matching once failed on the empty
    reduction over steps), and the model runs equal to the plain path."""
    from npuforge.quant.ort_multipliers import M_MAX, multiplier_interval

    t = levels = np.zeros((2, 0), np.int64)
    lower, upper = multiplier_interval(t, levels, np.zeros(2, np.int64), np.ones(2, np.int64), np.zeros(2, np.int64),
                                       np.zeros((2, 0), bool))
    assert lower.tolist() == [0, 0] and upper.tolist() == [M_MAX, M_MAX]
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 1))
    with torch.no_grad():
        module[0].weight.zero_()
        module[0].bias.fill_(-1.0)
    g, x = quantized_graph(module, (2, 3, 8, 8))
    both(g, {g.inputs[0]: x}, "fixedpoint")


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_matched_multipliers_run_as_qlinearconv(case):
    """After match_multipliers (the quantizer's last step), the fixed-point and single
    modes run a Conv's matched channels as QLinearConv, bit for bit, with multipliers
    moved by less than 2^-18."""
    from npuforge.quant.ort_multipliers import match_multipliers
    from npuforge.quant.requant import multiplier_value, requant_multiplier

    rng = np.random.default_rng(390 + case)
    g, x, *_ = conv_case(rng, **CONV_CASES[case])
    q = g.nodes[0].quant  # the quantizer's folded form (shift 0); TFLite's rounds twice, see ort_multipliers
    folded = requant_multiplier(multiplier_value(g.values[q["multiplier"]].data, g.values[q["shift"]].data))
    g.values[q["multiplier"]].data, g.values[q["shift"]].data = folded
    def real():  # the multipliers' values (a right shift may be folded into its multiplier)
        return multiplier_value(g.values[q["multiplier"]].data, g.values[q["shift"]].data).astype(np.float64)

    before = real()
    report = match_multipliers(g)
    after = real()
    assert report["channels"] == len(before)  # (the share matched on a real model: test_sim_integer_model)
    assert np.all(np.abs(after - before) <= before * 2.0**-18)
    unmatched = report["channels"] - report["matched"]  # (where float32 rounding moves a step: run apart)
    for mode in ("fixedpoint", "single"):  # (single rounding, once, may be reproduced where a right shift is left)
        lowering = both(g, {"x": x}, mode)["qoperator"].lowering["n"]
        apart = int(lowering.split("; ")[1].split()[0]) if ";" in lowering else 0
        assert lowering.startswith("QLinearConv") and (apart == unmatched if mode == "fixedpoint" else
                                                      apart <= unmatched)


def test_a_right_shift_is_folded_where_that_lets_qlinearconv_reproduce_the_channel():
    """A multiplier below 2^-11 keeps a right shift (TFLite's normalized form), which rounds twice,
    the second time half away from zero on both sides: on outputs of both signs no float32 scale
    follows it. match_multipliers folds the shift into the multiplier (round(M / 2^e), moving it by
    at most 2^-20, or more where the channel's outputs stay small) where that channel then matches,
    so it runs as QLinearConv; no output moves by more than 2^-10 of a code and the lowering still
    equals the plain simulator."""
    from npuforge.quant.ort_multipliers import fold_shifts, match_multipliers
    from npuforge.quant.requant import multiplier_value

    m, e = fold_shifts(np.int64([2**30 + 12345, 2**30 + 12345, 2**31 - 1]), np.int64([11, 12, 0]))
    assert list(e) == [0, 0, 0] and m[0] == round((2**30 + 12345) / 2**11) and m[2] == 2**31 - 1
    assert list(fold_shifts(np.int64([2**30 + 12345]), np.int64([15]))[1]) == [15]  # 16 bits left: too coarse
    rng = np.random.default_rng(395)
    g, x, *_ = conv_case(rng, cout=8)
    q = g.nodes[0].quant
    g.values["y"].quant.zero_point = np.array(128, np.int32)  # outputs of both signs, as a projection's
    g.values["y"].quant.scale = np.array(g.values["y"].quant.scale * 8, np.float32)  # multipliers below 2^-11
    real = np.float64(g.values["x"].quant.scale) * g.values["w"].quant.scale.astype(np.float64) / \
        np.float64(g.values["y"].quant.scale)
    assert (real < 2.0**-11).all()
    shift = np.floor(np.log2(real)).astype(np.int64) + 1  # normalized: M in [2^30, 2^31)
    g.values[q["multiplier"]].data = np.round(real * 2.0 ** (31 - shift)).astype(np.int32)
    g.values[q["shift"]].data = shift.astype(np.int32)
    before = multiplier_value(g.values[q["multiplier"]].data, g.values[q["shift"]].data)
    report = match_multipliers(g)
    after = multiplier_value(g.values[q["multiplier"]].data, g.values[q["shift"]].data)
    assert report["max_code_change"] <= 2.0**-10  # (outputs this small may move their multipliers further)
    assert np.all(np.abs(after - before) <= before * 2.0**-14)
    folded = int((np.asarray(g.values[q["shift"]].data) == 0).sum())
    assert report["matched"] >= 5 and folded >= 4  # (none had shift 0 before)
    lowering = both(g, {"x": x}, "fixedpoint")["qoperator"].lowering["n"]
    assert lowering == "QLinearConv" or int(lowering.split("; ")[1].split()[0]) <= 8 - folded


def unprove(monkeypatch, apart) -> None:
    """QOperatorBuilder's proven float32 scales, less the channels where ``apart(node, channel)`` holds
    (``channel``: the node's channel indices), which then run apart."""
    from npuforge.sim.qoperator import QOperatorBuilder

    scales = QOperatorBuilder._scales

    def some_unproven(self, node):
        s, bias, proven = scales(self, node)
        return s, bias, proven & ~apart(node, np.arange(len(proven)))

    monkeypatch.setattr(QOperatorBuilder, "_scales", some_unproven)


@pytest.mark.parametrize("case", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("mode", ["fixedpoint", "onnx"])
@pytest.mark.parametrize("few", [False, True])
def test_channels_without_a_float32_scale_run_apart(case, mode, few, monkeypatch):
    """Channels with no proven float32 scale run apart (plain, strided, depthwise, 1x1 and dilated
    convolutions): a 1x1 convolution as MatMulInteger on the channels-last input, a wider one
    (not grouped) as MatMulInteger of its input's columns where ONNX Runtime's u8s8 kernels are
    exact, else as ConvInteger; then a proven float formula, merged back in channel order: every
    third channel by a Concat and a Gather, one channel of 16 by a ScatterElements on the
    channels-last axis. With more than half the channels apart and a MatMulInteger, all of them
    run that way and no QLinearConv. (Outputs past SMALL_OUTPUT per sample: the tests' are small.)"""
    from npuforge.sim import qoperator
    from npuforge.sim.qoperator import signed_weights_exact

    monkeypatch.setattr(qoperator, "SMALL_OUTPUT", 0)
    unprove(monkeypatch, lambda node, channel: (channel == 1) if few else (channel % 3 == 1))
    rng = np.random.default_rng(400 + case)
    args = dict(CONV_CASES[case])
    if few:
        args.update(cout=16, **({"group": 16, "cin": 16} if "group" in args else {}))
    g, x, *_ = conv_case(rng, **args)
    if few:  # multipliers QLinearConv reproduces: channel 1 the only one apart
        from npuforge.quant.ort_multipliers import match_multipliers

        assert match_multipliers(g)["matched"] == 16
    low = both(g, {"x": x}, mode)["qoperator"]
    report = low.lowering["n"]
    kernel = "MatMulInteger" if case == 3 or case != 2 and signed_weights_exact() else "ConvInteger"
    assert kernel in report, report
    merged, apart, channels = re.match(r"(QLinearConv; )?(\d+) of (\d+) channels", report).groups()
    assert bool(merged) == (int(apart) * 2 <= int(channels) or kernel == "ConvInteger"), report
    assert any(n.op_type == "QLinearConv" for n in low.model.graph.node) == bool(merged)
    assert report.startswith("QLinearConv; 1 of 16") == few
    assert any(n.op_type == "ScatterElements" for n in low.model.graph.node) == few


@pytest.mark.parametrize("mode", ["fixedpoint", "onnx"])
def test_a_small_layer_with_a_channel_apart_runs_whole_on_the_integer_kernel(mode, monkeypatch):
    """A classifier's Gemm (12 outputs per sample, at most SMALL_OUTPUT) with one channel no float32
    scale reproduces: every channel on MatMulInteger, no QLinearConv to merge with."""
    from npuforge.sim.qoperator import signed_weights_exact

    if not signed_weights_exact():
        pytest.skip("MatMulInteger's u8s8 kernels are exact only where ONNX Runtime has VNNI (x86)")
    unprove(monkeypatch, lambda node, channel: (channel == 1) & (node.op == "Gemm"))
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                 torch.nn.Flatten(), torch.nn.Linear(8, 12))
    g, x = quantized_graph(module, (2, 3, 8, 8))
    low = both(g, {g.inputs[0]: x}, mode)["qoperator"]
    gemm = next(n.name for n in g.nodes if n.op == "Gemm")
    assert low.lowering[gemm].startswith("1 of 12 channels no float32 scale reproduces: all MatMulInteger")
    assert [n.op_type for n in low.model.graph.node].count("QLinearConv") == 1  # the Conv's


class Tokens(torch.nn.Module):
    """A transformer's linear layers: MatMul of [B, T, K] tokens by a constant, its bias a separate
    Add of a constant vector, a Gemm with a fused Relu after a flatten."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(12, 10) * 0.3)
        self.b = torch.nn.Parameter(torch.randn(10) * 0.5)
        self.fc = torch.nn.Linear(70, 6)

    def forward(self, x):
        return torch.relu(self.fc((x @ self.w + self.b).flatten(1)[:, :70]))


@pytest.mark.parametrize("tokens", ["static", "symbolic"])
def test_rows_reshaped_back_by_a_constant_shape_where_only_the_batch_is_unknown(tokens):
    """A MatMul by a constant on [B, T, K], run on [1, B T, 1, K] rows: reshaped back to [-1, T, N]
    by a constant where T is static; by the input's Shape where T is symbolic too. The same for its
    bias Add: QLinearAdd of the codes stored at one sample's shape [1, T, N] (broadcast over a batch
    of 4), or expanded at run time to the activation's."""
    torch.manual_seed(0)
    g, x = quantized_graph(Tokens(), (2, 7, 12))
    matmul = next(n for n in g.nodes if n.op == "MatMul")
    if tokens == "symbolic":
        g.values[matmul.inputs[0]].shape = [g.values[matmul.inputs[0]].shape[0], "T", 12]
        g.values[matmul.outputs[0]].shape = [g.values[matmul.outputs[0]].shape[0], "T", 10]
    low = both(g, {g.inputs[0]: x}, "fixedpoint")["qoperator"]
    shapes = [n for n in low.model.graph.node if n.op_type == "Shape" and n.input[0] == matmul.inputs[0]]
    assert len(shapes) == (tokens == "symbolic")
    bias = next(n for n in g.nodes if n.op == "Add")
    assert x.shape[0] > 1 and low.lowering[bias.name].startswith("QLinearAdd of the constant's codes")
    assert [n.op_type for n in low.model.graph.node].count("Expand") == (tokens == "symbolic")


@pytest.mark.parametrize("apart", [None, "concat", "scatter"])
@pytest.mark.parametrize("signed", [False, True])
def test_matmul_by_a_constant_and_gemm_run_channels_last_as_one_product(apart, signed, monkeypatch):
    """A MatMul by a [K, N] constant (any rank of input) and a Gemm run as ONNX Runtime's
    channels-last QLinearConv on [1, rows, 1, K]: one matrix product over every row of every batch
    item, reshaped back; channels no float32 scale reproduces (every third here) as MatMulInteger on
    the same rows, merged on the last axis; the bias Add as QLinearAdd of the constant's codes
    expanded to the rows. Codes equal the plain path's with uint8 weights (u8u8); with int8 ones
    (u8s8, taken on VNNI) they must where ONNX Runtime sums u8s8 exactly."""
    from npuforge.sim import qoperator

    if apart:  # merged into QLinearConv's output, however small the layer
        unprove(monkeypatch, lambda node, channel: channel % 3 == 1)
        monkeypatch.setattr(qoperator, "SMALL_OUTPUT", 0)
    if apart == "scatter":  # (a third of the channels: merged by a ScatterElements all the same)
        monkeypatch.setattr(qoperator, "SCATTER_FRACTION", 2)
    exact = qoperator.signed_weights_exact()
    monkeypatch.setattr(qoperator, "signed_weights_exact", lambda: signed)
    torch.manual_seed(0)
    g, x = quantized_graph(Tokens(), (2, 7, 12))
    matmul = next(n.name for n in g.nodes if n.op == "MatMul")
    gemm = next(n.name for n in g.nodes if n.op == "Gemm")
    bias = next(n.name for n in g.nodes if n.op == "Add")
    for mode in ("fixedpoint", "onnx"):
        if signed and not exact:  # (ONNX Runtime's u8s8 pair sums saturate on this CPU)
            low = LoweredSimulator(g, mode, form="qoperator")
            low.run({g.inputs[0]: x})
        else:
            low = both(g, {g.inputs[0]: x}, mode)["qoperator"]
        for name in (matmul, gemm):
            assert low.lowering[name].startswith("QLinearConv") and ("MatMulInteger" in low.lowering[name] or not apart)
        assert low.lowering[bias].startswith("QLinearAdd of the constant's codes")
    convs = [n for n in low.model.graph.node if n.op_type == "QLinearConv"]
    assert len(convs) == 2 and all(n.domain == "com.microsoft" for n in convs)
    assert any(n.op_type == "ScatterElements" for n in low.model.graph.node) == (apart == "scatter")
    weights = {i.name: i.data_type for i in low.model.graph.initializer}
    assert {weights[n.input[3]] for n in convs} == {onnx.TensorProto.INT8 if signed else onnx.TensorProto.UINT8}


def test_dead_channels_with_a_bias_at_int32s_end():
    """A channel whose bias is saturated at int32's end has a constant output, but its
    accumulator range leaves int32, where ONNX Runtime's int32 bias addition would wrap:
    it gets a bias inside int32 giving the same constant, and still runs as QLinearConv."""
    from npuforge.quant.ort_multipliers import match_multipliers

    rng = np.random.default_rng(410)
    g, x, *_ = conv_case(rng, wmax=127)
    bias = g.values[g.nodes[0].quant["bias"]]
    data = bias.data.astype(np.int64)
    data[0], data[1] = -(2**31), 2**31 - 1
    bias.data = data.astype(np.int32)
    from npuforge.quant.requant import multiplier_value, requant_multiplier

    q = g.nodes[0].quant
    g.values[q["multiplier"]].data, g.values[q["shift"]].data = \
        requant_multiplier(multiplier_value(g.values[q["multiplier"]].data, g.values[q["shift"]].data))
    match_multipliers(g)
    for mode in MODES:
        assert both(g, {"x": x}, mode)["qoperator"].lowering["n"] == "QLinearConv"


def test_ort_and_tflite_multipliers_exclude_each_other():
    from npuforge.errors import NpuforgeError
    from npuforge.quant.config import QuantConfig

    with pytest.raises(NpuforgeError, match="exclude each other"):
        QuantConfig(ort_multipliers=True, tflite_multipliers=True)


def test_quantize_picks_multipliers_ort_reproduces_by_default():
    """By default the quantizer moves each 8-bit Conv's multipliers to ones QLinearConv reproduces
    (the integer program runs on ONNX Runtime's kernels, no channel apart); ort_multipliers=False
    keeps the nearest, and TFLite's multipliers are never moved."""
    import npuforge
    from npuforge.quant.config import QuantConfig
    from npuforge.sim.lowered import LoweredSimulator

    assert QuantConfig().resolved_ort_multipliers and not QuantConfig(target="tflite").resolved_ort_multipliers
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), torch.nn.ReLU(), torch.nn.Conv2d(64, 48, 1))
    torch.manual_seed(3)
    graph = npuforge.from_torch(module.eval(), torch.zeros(1, 3, 12, 12))
    calib = [np.random.default_rng(k).standard_normal((2, 3, 12, 12)).astype(np.float32) for k in range(3)]
    made = {}
    for option in (None, False):
        q = npuforge.quantize(graph, calib, {} if option is None else {"ort_multipliers": option})
        low = LoweredSimulator(q, "fixedpoint", form="qoperator")
        made[option] = (q, sum(how.count(";") for how in low.lowering.values()))
        x = calib[0]
        np.testing.assert_array_equal(low.run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]],
                                      IntegerSimulator(q).run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]])
    report = made[None][0].metadata["quantization"]["ort_multipliers"]
    assert report["matched"] == report["channels"] == 112 and report["max_code_change"] <= 2**-10
    assert "ort_multipliers" not in made[False][0].metadata["quantization"]
    assert made[None][1] == 0 < made[False][1]  # the nearest multipliers leave channels apart here


def test_fast_engine_lowers_float_nodes_and_eval_says_why_auto_is_slow(tmp_path, capsys):
    """--sim-engine fast (eval's default): a model with a layer kept in float runs lowered (auto
    falls back to the plain simulator, and eval --engine int says so in one note, pointing to
    fast); both give the same top-1 here."""
    import npuforge
    from npuforge.cli import main

    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    torch.manual_seed(0)
    graph = npuforge.from_torch(module.eval(), torch.zeros(2, 6))
    rng = np.random.default_rng(3)
    q = npuforge.quantize(graph, [rng.standard_normal((16, 6)).astype(np.float32)], {"keep_float": ["/0/Gemm"]},
                          log=lambda m: None)
    auto, fast = make_simulator(q, "fixedpoint", "auto"), make_simulator(q, "fixedpoint", "fast")
    assert isinstance(auto, IntegerSimulator) and "it runs in float" in auto.fallback
    assert isinstance(fast, LoweredSimulator) and fast.lowering["/0/Gemm"].startswith("in float")
    npuforge.save(q, tmp_path / "q.nfir")
    for cls in ("0", "1", "2"):
        (tmp_path / "data" / cls).mkdir(parents=True)
        np.save(tmp_path / "data" / cls / "x.npy", rng.standard_normal((4, 6)).astype(np.float32))
    top1 = {}
    for engine in ("auto", "fast", None):
        assert main(["eval", str(tmp_path / "q.nfir"), "--data", str(tmp_path / "data"), "--engine", "int",
                     *(["--sim-engine", engine] if engine else [])]) == 0
        out, err = capsys.readouterr()
        notes = [line for line in err.splitlines() if line.startswith("note: the integer program runs on the plain")]
        assert len(notes) == (engine == "auto") and all("--sim-engine fast" in n for n in notes)
        top1[engine] = out.split("top-1 ")[1].split("%")[0]
    assert top1["auto"] == top1["fast"] == top1[None]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_float_inputs_quantized_by_onnx_runtime_as_quantize_input(dtype):
    """The lowered simulator quantizes float inputs with ONNX Runtime's QuantizeLinear: the same codes
    as quantize_input on random values, exact ties (k + 1/2 steps), the clamp's ends and beyond."""
    from npuforge.sim.integer import quantize_input

    rng = np.random.default_rng(360)
    g, x, *_ = conv_case(rng)
    p = g.values["x"].quant
    p.dtype, p.zero_point = dtype, np.int32(3 if dtype == "uint8" else -5)
    s = np.float32(p.scale)
    ties = (np.arange(-300, 300) + np.float32(0.5)) * s
    values = np.concatenate([rng.standard_normal(5000).astype(np.float32) * 200 * s, ties,
                             np.float32([0, -0.0, 1e30, -1e30, 127.5 * s, -128.5 * s])])
    low = LoweredSimulator(g, "fixedpoint", form="float")
    np.testing.assert_array_equal(low._quantize("x", values, p), quantize_input(values, p))


def test_threshold_guess_of_a_zero_scale_warns_nothing():
    """A dead channel's scale of 0 has no step: its guessed thresholds are the range's end, with no
    NumPy warning (it reached the user's terminal on six real models)."""
    import warnings

    from npuforge.sim.monotone_fit import Formula

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for symmetric in (False, True):
            x = Formula(np.float64([0.0, 0.5]), np.float64([0.0, 0.0]), symmetric=symmetric).steps(
                np.tile(np.arange(-2, 3), (2, 1)))
            assert x.dtype == np.int64 and (np.abs(x[0]) == 2**62).all()


def test_a_cast_of_an_integer_input_into_a_quantized_value_is_lowered_exactly():
    """Silero VAD adds its sample rate, cast to float, to an activation: the Cast runs in float as
    the plain path runs it (one correctly rounded conversion, then the output's quantization), so the
    program lowers instead of falling back to the plain path."""
    import npuforge
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("Mul", ["n", "k"], ["nk"]), helper.make_node("Cast", ["nk"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "f"], ["y"])], "cast_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [numpy_helper.from_array(np.int64(3), "k")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph = npuforge.import_onnx(model)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(size=(1, 4)).astype(np.float32), "n": np.array(k, np.int64)} for k in range(4)]
    q = npuforge.quantize(graph, feeds, log=lambda m: None)
    assert q.values["f"].quant is not None
    lowered, plain = make_simulator(q, "fixedpoint", "ort"), IntegerSimulator(q)
    for f in feeds:
        np.testing.assert_array_equal(lowered.run(f, dequantize=False)["y"], plain.run(f, dequantize=False)["y"])


class HelperBuilder:
    """The two methods of a lowering builder the int64 helpers of lowered_int64 call."""

    def __init__(self):
        self.nodes, self.inits, self.names = [], [], set()

    def const(self, name, arr):
        if name not in self.names:
            self.names.add(name)
            self.inits.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
        return name

    def emit(self, op, inputs, output, **attrs):
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 62), st.integers(0, 2**62), st.integers(0, 2**31))
def test_floor_division_by_a_power_of_two_in_both_forms(k, bound, seed):
    """lowered_int64._floor_div: the offset form (|x| within its bound, below 2^62, shifted as uint64)
    and the Mod form give numpy's floor division on int64 values, the extremes of the bound
    included, with the exponent a constant or a tensor."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from npuforge.sim import lowered_int64

    edge = min(bound, 2**62 - 1)
    x = np.concatenate([np.array([-edge, edge, 0, -1, 1], np.int64),
                        np.random.default_rng(seed).integers(-edge, edge, 64, endpoint=True, dtype=np.int64)])
    for given_bound, as_tensor in ((bound, False), (None, False), (bound, True), (None, True)):
        b = HelperBuilder()
        exponent = b.const("k", np.full(1, k, np.int64)) if as_tensor else np.int64(k)
        lowered_int64._floor_div(b, "x", exponent, "y", bound=given_bound)
        assert any(n.op_type == "Mod" for n in b.nodes) == (given_bound is None or given_bound >= 2**62)
        graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [None])],
                                  [helper.make_tensor_value_info("y", TensorProto.INT64, [None])], b.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, np.floor_divide(x, np.int64(1 << k)))


@settings(max_examples=40, deadline=None)
@given(st.integers(1 << 30, (1 << 31) - 1), st.integers(-24, 14), st.integers(0, 14), st.booleans())
def test_an_int16_operand_rescaled_in_float64_equals_the_integer_rescaling(multiplier, shift, bits, single):
    """lowered_int64._rescaled, an int16 Add operand's R(q 2^bits) in float64 ops, equals the
    plain path's fixed-point (or single) rounding on every int16 code, ties of both roundings
    in both signs included."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from npuforge.sim import lowered_int64
    from npuforge.sim.int_ops import requantize_fixedpoint, requantize_single

    bits = min(bits, 14 - max(shift, 0))  # |q| 2^(bits + max(shift, 0)) below 2^30, as extra_bits keeps it
    b = HelperBuilder()
    lowered_int64._rescaled(b, "x", multiplier, shift, bits, single, "t")
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("t", TensorProto.DOUBLE, [None])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    q = np.arange(-32768, 32768, dtype=np.int64)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": q.astype(np.float32)})[0]
    rule = requantize_single if single else requantize_fixedpoint
    want = rule(torch.from_numpy(q << bits), multiplier, shift).numpy()
    np.testing.assert_array_equal(got, want.astype(np.float64))


def test_inverse_square_root_in_float64_is_exact_for_every_shifted_d():
    """lowered_int64._inverse_root, floor(2^30 / sqrt(D_h)) in ONNX Runtime's float64 Sqrt and Div,
    is the rule's isqrt(2^60 // D_h) for every D_h it is given: 1 to 2^23 - 1."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from npuforge.sim import lowered_int64

    b = HelperBuilder()
    lowered_int64._inverse_root(b, "d", "r")
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("d", TensorProto.DOUBLE, [None])],
                              [helper.make_tensor_value_info("r", TensorProto.DOUBLE, [None])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    d = np.arange(1, 1 << 23, dtype=np.int64)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"d": d.astype(np.float64)})[0]
    a = (1 << 60) // d  # its isqrt: a float64 estimate moved to the one r with r^2 <= a < (r + 1)^2
    r = np.sqrt(a.astype(np.float64)).astype(np.int64)
    for _ in range(2):
        r = np.where(r * r > a, r - 1, r)
        r = np.where((r + 1) * (r + 1) <= a, r + 1, r)
    assert (r * r <= a).all() and ((r + 1) * (r + 1) > a).all()
    for k in (0, 1, 2, 4_194_303, len(d) - 1):
        assert r[k] == math.isqrt(int(a[k]))
    np.testing.assert_array_equal(got, r.astype(np.float64))


def test_integer_square_root_in_onnx_ops_is_exact_next_to_squares():
    """lowered_int64._isqrt (a biased float64 estimate and one correction upward) is math.isqrt
    on 0 to 3, on k^2 - 1, k^2 and k^2 + 1 for 4,000 k up to 2^31 - 1, and at 2^62 - 1."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from npuforge.sim import lowered_int64

    b = HelperBuilder()
    lowered_int64._isqrt(b, "a", "r")
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("a", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("r", TensorProto.INT64, [None])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    k = np.concatenate([np.random.default_rng(0).integers(1, 1 << 31, 4000), [1 << 30, (1 << 31) - 1]])
    a = np.concatenate([[0, 1, 2, 3, (1 << 62) - 1], *(k * k + d for d in (-1, 0, 1))]).astype(np.int64)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    np.testing.assert_array_equal(got, [math.isqrt(int(v)) for v in a])


@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_channels_apart_with_accumulators_past_2_24_run_on_integer_kernels(op):
    """A Gemm / MatMul whose accumulators pass float32's 2^24 (K = 4096) keeps the channels no
    float32 scale reproduces on MatMulInteger, their int32 sums requantized in float64, instead
    of sending the whole product to float64 kernels; the codes equal the plain path's."""
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4096, 64)

        def forward(self, x):  # a 3-D input exports as MatMul + Add, a 2-D one as Gemm
            return self.fc(x)

    shape = (1, 4096) if op == "Gemm" else (1, 5, 4096)
    g, x = quantized_graph(Wide(), shape, config={"ort_multipliers": False})
    node = next(n for n in g.nodes if n.op == op)
    assert IntegerSimulator(g)._prep_compute(node)["ftype"] is torch.float64
    low = both(g, {g.inputs[0]: x}, "fixedpoint")["qoperator"]
    how = low.lowering[node.name]
    assert re.search(r"channels(:| no float32 scale reproduces: all) MatMulInteger, float64", how), how


def test_a_clamp_to_the_quantizers_own_saturation_is_left_to_it(monkeypatch):
    """Channels apart (made so here) go back to codes by QuantizeLinear(v, 1, zp), which saturates to
    [0, 255] itself: no Clip to [-zp, 255 - zp] before it (checked by ``both`` on every qoperator
    program), a narrower clamp (a fused Relu's) staying. Codes as the plain path's."""
    from npuforge.sim import qoperator

    monkeypatch.setattr(qoperator, "SMALL_OUTPUT", 0)
    unprove(monkeypatch, lambda node, channel: channel % 3 == 1)
    for act in ("", "Relu"):
        g, x, *_ = conv_case(np.random.default_rng(7), act=act)
        model = both(g, {"x": x}, "fixedpoint")["qoperator"].model
        consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
        made_by = {n.output[0]: n for n in model.graph.node}
        unit = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and consts.get(n.input[1]) == 1]
        assert len(unit) == 1 and (made_by[unit[0].input[0]].op_type == "Clip") == (act == "Relu")


class Classifier1d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv1d(4, 8, 3), torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool1d(torch.relu(self.conv(x)), 1), 1))


def test_a_reshape_of_a_reshape_reads_the_first_ones_input():
    """A Flatten then the classifier's Reshape to rows: one Reshape in the qoperator program (``both``
    checks every program for a reshaping node read only by a Reshape to a constant shape)."""
    g, x = quantized_graph(Classifier1d(), (2, 4, 9))
    model = both(g, {g.inputs[0]: x}, "fixedpoint")["qoperator"].model
    assert "Flatten" in g.op_histogram() and [n.op_type for n in model.graph.node].count("Flatten") == 0


class PastKeys(torch.nn.Module):
    """GPT-2's attention concatenates its past keys, none at the first step: a Concat of one input."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.cat([torch.relu(x)], dim=1)) + x


def test_a_concat_of_one_input_is_read_through():
    g, x = quantized_graph(PastKeys(), (2, 3, 8))
    assert "Concat" in g.op_histogram()
    model = both(g, {g.inputs[0]: x}, "fixedpoint")["qoperator"].model
    assert "Concat" not in [n.op_type for n in model.graph.node]


def assert_no_redundant_nodes(model) -> None:
    """No node of a qoperator program that QOperatorBuilder.finish bypasses: a Clip to [-zp, 255 - zp]
    read only by QuantizeLinear(v, 1, zp), a reshaping node read only by a Reshape to a constant shape,
    a copy (an Identity, a Concat of one input) read by any node, codes of zero point 0 by Floor, Cast
    and QuantizeLinear."""
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    made_by = {o: n for n in model.graph.node for o in n.output}
    readers = collections.Counter(i for n in model.graph.node for i in n.input)
    for n in model.graph.node:
        p = made_by.get(n.input[0]) if n.input else None
        if p is None or readers[p.output[0]] != 1:
            continue
        if n.op_type == "QuantizeLinear" and p.op_type == "Clip" and consts.get(n.input[1]) == 1:
            zp = int(consts[n.input[2]])
            assert tuple(float(consts[k]) for k in p.input[1:]) != (-zp, 255 - zp), n.name
        if n.op_type == "QuantizeLinear" and p.op_type == "Cast" and consts.get(n.input[2]) == 0:
            floor = made_by.get(p.input[0])  # zero point 0: Cast(Clip(w, 0, 255), uint8) (finish)
            assert floor is None or floor.op_type != "Floor" or readers[floor.output[0]] > 1, n.name
        if n.op_type == "Reshape" and n.input[1] in consts and (consts[n.input[1]] != 0).all():
            assert p.op_type not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"), n.name
    outputs = {o.name for o in model.graph.output}
    for n in model.graph.node:
        for name in n.input:
            p = made_by.get(name)
            assert p is None or name in outputs or not (p.op_type == "Identity" or p.op_type == "Concat" and
                                                        len(p.input) == 1), f"{n.name} reads a copy"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**40), st.integers(1, 30), st.integers(1, 2**31 - 1), st.integers(0, 2**12))
def test_a_symmetric_floor_runs_as_a_truncation_only_where_it_stays_below_2_31(seed, e, m, reach_bits):
    """sign(x) floor(|x| r + b) as trunc(x r + sign(x) b) in float64 (what the lowering casts to int32),
    on every x of a range that _truncates admits, ends included; ranges past 2^31 and negative r or b
    are refused."""
    from npuforge.sim.lowered import _truncates
    from npuforge.sim.monotone_fit import Formula

    r = np.array([m * 2.0**-31 * 2.0**-e])
    f = Formula(r, np.array([0.5 + 0.5 ** (e + 1)]), dtype=np.float64, symmetric=True, acc_dtype=np.float64)
    reach = int(min((2**31 - 2) / max(r[0], 2**-60), 2**52)) >> (reach_bits % 3)
    assert _truncates(f, reach) and not _truncates(f, None)
    assert not _truncates(f, int(2**31 / r[0]) + 1) if r[0] > 2**-21 else True
    assert not _truncates(Formula(-r, f.b, dtype=np.float64, symmetric=True), 1)
    x = np.concatenate([np.random.default_rng(seed).integers(-reach, reach + 1, 2000), [-reach, reach, -1, 0, 1]])
    z = x.astype(np.float64) * r[0] + np.sign(x).astype(np.float64) * f.b[0]
    # clamped within float32's integers, as every output is (evaluate's product by the sign is in float32)
    np.testing.assert_array_equal(np.clip(np.trunc(z), -2**20, 2**20), f.evaluate(x[None, :], -2**20, 2**20)[0])


@pytest.mark.parametrize("mode", MODES)
def test_a_normalizations_codes_come_from_one_clamp_and_a_cast_to_uint8(mode):
    """floor(w) + zp saturated, w the float64 output sum, as Cast(Clip(w + zp, 0, 255), uint8) with the zero
    point moved into w's constant: equal to the plain path on the calibration's rows and on rows of one
    spike, whose outputs reach past both ends of the calibrated range; no QuantizeLinear left for them."""
    import npuforge

    torch.manual_seed(0)
    module = torch.nn.LayerNorm(64)
    with torch.no_grad():
        module.weight.uniform_(-3, 3)
    graph = npuforge.from_torch(module.eval(), torch.zeros(2, 8, 64), dynamic_batch=True)
    rng = np.random.default_rng(5)
    calib = rng.standard_normal((4, 8, 64)).astype(np.float32)
    q = npuforge.quantize(graph, [calib], log=lambda m: None)
    node = next(n for n in q.nodes if n.op == "LayerNormalization")
    spikes = np.zeros((2, 8, 64), np.float32)
    spikes[:, np.arange(8), rng.integers(0, 64, 8)] = 3
    for rows in (calib, spikes):
        x = q.values[q.inputs[0]].quant.quantize(rows)
        low = both(q, {q.inputs[0]: x}, mode)["qoperator"]
    codes = IntegerSimulator(q, mode).run({q.inputs[0]: x}, dequantize=False)[node.outputs[0]]
    assert {0, 255} <= set(np.unique(codes).tolist())
    made_by = {o: n for n in low.model.graph.node for o in n.output}
    out = made_by[node.outputs[0]]
    assert out.op_type == "Cast" and made_by[out.input[0]].op_type == "Clip", out


def test_a_matmul_of_two_activations_takes_a_multiplier_qlinearmatmul_reproduces():
    """Attention's weights times V with TFLite's normalized multiplier (a right shift: two roundings, the
    second half away from zero, on outputs of both signs) has no float32 scale QLinearMatMul follows;
    match_multipliers folds the shift and picks a multiplier within its allowed change that one
    reproduces on every accumulator the product can reach, so it runs as QLinearMatMul, equal to the
    plain path. quantize does so by default."""
    from npuforge.quant.ort_multipliers import match_multipliers
    from npuforge.quant.requant import multiplier_value

    g, x = quantized_graph(Attention(), (2, 6, 4), config={"ort_multipliers": False})
    node = [n for n in g.nodes if n.op == "MatMul" and IntegerSimulator(g, "fixedpoint")._kind(n) == "matmul"][-1]
    q = node.quant
    real = float(multiplier_value(g.values[q["multiplier"]].data, g.values[q["shift"]].data).reshape(-1)[0])
    shift = math.floor(math.log2(real)) + 1  # normalized: M in [2^30, 2^31), a right shift of -shift
    g.values[q["multiplier"]].data = np.array([round(real * 2.0 ** (31 - shift))], np.int32)
    g.values[q["shift"]].data = np.array([shift], np.int32)
    assert shift < 0 and "in float" in both(g, {g.inputs[0]: x}, "fixedpoint")["qoperator"].lowering[node.name]
    report = match_multipliers(g)
    after = float(multiplier_value(g.values[q["multiplier"]].data, g.values[q["shift"]].data).reshape(-1)[0])
    assert report["matched"] == report["channels"] and report["max_code_change"] <= 2.0**-10
    assert abs(after - real) <= real * 2.0**-14 and int(np.asarray(g.values[q["shift"]].data).reshape(-1)[0]) == 0
    assert both(g, {g.inputs[0]: x}, "fixedpoint")["qoperator"].lowering[node.name].startswith("QLinearMatMul")
    g, x = quantized_graph(Attention(), (2, 6, 4))
    assert g.metadata["quantization"]["ort_multipliers"]["channels"] == 3 * 8 + 2  # Q, K, V, the two products


@pytest.mark.parametrize("mode", MODES)
def test_a_constant_of_one_code_is_one_table_over_the_activation(mode):
    """xcit's qkv projection adds a zero bias after a MatMul of tokens, into int16: a constant of one
    code that broadcasts into the activation is one table over its codes (not one per element), read at
    the code alone."""
    import npuforge

    torch.manual_seed(0)
    module = torch.nn.Linear(8, 6)
    with torch.no_grad():
        module.bias.fill_(0.25)
    graph = npuforge.from_torch(module.eval(), torch.zeros(1, 5, 8), dynamic_batch=True)
    add = next(n for n in graph.nodes if n.op == "Add")
    rng = np.random.default_rng(3)
    q = npuforge.quantize(graph, [rng.standard_normal((4, 5, 8)).astype(np.float32)], {"int16": [add.name]},
                          log=lambda m: None)
    assert q.values[add.outputs[0]].quant.dtype == "int16"
    x = q.values[q.inputs[0]].quant.quantize(rng.standard_normal((3, 5, 8)).astype(np.float32))
    lows = both(q, {q.inputs[0]: x}, mode)
    assert lows["float"].lowering[add.name] == "table 256 over one operand and the constant's 1 distinct codes"
    assert not any(n.name.startswith(f"{add.name}::row") for n in lows["float"].model.graph.node)
