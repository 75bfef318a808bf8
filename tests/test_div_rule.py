"""Div by an activation (quant/div_rule.py): the exact quotient of the codes times the ratio of
scales, rounded once. The rule against exact rational arithmetic (hypothesis), node by node
against the float op on the simulator's own codes, end to end against fake-quant and the QDQ
file in ONNX Runtime, and the lowered engine against the plain path."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import npuforge
from npuforge.quant.div_rule import divide
from npuforge.sim.integer import IntegerSimulator
from npuforge.sim.lowered import LoweredSimulator
from test_quant_rules_37 import ROUNDINGS, _end_to_end, _node_errors, _quantized


CODES = st.one_of(st.integers(-255, 255), st.integers(-65535, 65535))  # 8- and 16-bit operands less zero points


@settings(max_examples=500, deadline=None)
@given(CODES, CODES, st.integers(1 << 30, (1 << 31) - 1), st.one_of(st.integers(-20, 20), st.integers(-31, 30)))
def test_divide_rounds_the_exact_quotient_once_ties_away_from_zero(a, b, mult, shift):
    """Every shift a multiplier can have (-31 to 30), 16-bit operands: the int64 arithmetic never
    overflows (a tiny ratio of scales shifted the divisor past 2^63 before). Quotients beyond 2^17
    are compared saturated: any int16 output saturates on them."""
    got = int(divide(torch.tensor([a]), torch.tensor([b]), mult, shift)[0])
    if b == 0:
        assert got == (0 if a == 0 else (1 << 40) * (1 if a > 0 else -1))
        return
    exact = Fraction(a * mult, b) * Fraction(2) ** (shift - 31)
    floor = exact.numerator // exact.denominator
    frac = exact - floor
    want = floor + 1 if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and exact > 0) else floor
    assert max(-(1 << 17), min(got, 1 << 17)) == max(-(1 << 17), min(want, 1 << 17))


@pytest.mark.parametrize("shift", [-31, -24, 0, 15, 16, 30])
def test_divide_keeps_its_sign_at_the_extreme_shifts(shift):
    """The edges of the int64 arithmetic, with the largest 16-bit operands of every sign."""
    a = torch.tensor([65535, -65535, 65535, -65535, 1, -1, 0])
    b = torch.tensor([1, 1, -65535, 65535, 65535, -65535, 7])
    got = divide(a, b, (1 << 31) - 1, shift).tolist()
    for ga, gb, g in zip(a.tolist(), b.tolist(), got):
        exact = Fraction(ga * ((1 << 31) - 1), gb) * Fraction(2) ** (shift - 31)
        assert g == 0 or (g > 0) == (exact > 0), (ga, gb, g)
        assert abs(g - exact) <= Fraction(1, 2) or abs(exact) > (1 << 17)


class LinearAttentionNorm(nn.Module):
    """``a / (sum of positive features + 1)``, the divisor an activation of its own grid."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x) / (torch.relu(self.b(x)).sum(1, keepdim=True) + 1.0)


class Reciprocal(nn.Module):
    """``c / (x^2 + 0.5)``: a constant numerator, one per channel (a scalar one is a Reciprocal)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.tensor([[1.0], [-2.5]]))

    def forward(self, x):
        return self.c / (x * x + 0.5)


@pytest.mark.parametrize("module, shape", [(LinearAttentionNorm(), (2, 3, 6, 6)), (Reciprocal(), (1, 2, 16))])
@pytest.mark.parametrize("config", [{}, {"activation_dtype": "int8"}])
def test_div_by_an_activation_is_quantized_and_engines_agree(module, shape, config):
    graph, q, calib, messages = _quantized(module, shape, config)
    assert not [m for m in messages if "kept in float" in m], messages
    div = next(n for n in q.nodes if n.op == "Div")
    assert {"multiplier", "shift"} <= set(div.quant) and q.values[div.outputs[0]].quant is not None
    for rounding in ROUNDINGS:
        for name, (worst, count, size) in _node_errors(q, calib[0], {"Div"}, rounding).items():
            assert worst <= 1 and count <= max(1, size // 100), (rounding, name, worst, count)
        uint8 = q.values[q.inputs[0]].quant.dtype == "uint8"
        plain = IntegerSimulator(q, rounding)
        for form in ("qoperator", "float") if uint8 else ("float",):
            lowered = LoweredSimulator(q, rounding, form=form)
            for x in calib:
                np.testing.assert_array_equal(lowered.run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]],
                                              plain.run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]])
    # (float: 1 / (x^2 + 0.5) near 0 magnifies x's own grid step, whatever the Div's rule)
    _end_to_end(graph, q, calib[0], float_steps=4 if isinstance(module, LinearAttentionNorm) else None)


def test_a_divisor_at_its_zero_code_saturates_and_compiles(tmp_path):
    """A divisor quantized to exactly 0 (its epsilon lost on the grid) divides by zero: the output
    saturates to the numerator's side, in the integer program as in fake-quant's float division."""
    graph, q, calib, _ = _quantized(LinearAttentionNorm(), (1, 3, 6, 6))
    div = next(n for n in q.nodes if n.op == "Div")
    sim = IntegerSimulator(q)
    a, b = div.inputs
    codes = sim.run({q.inputs[0]: calib[0]}, outputs=[a, b, div.outputs[0]], dequantize=False)
    yq = q.values[div.outputs[0]].quant
    forced = {a: codes[a], b: np.full_like(codes[b], q.values[b].quant.zero_point)}
    y = sim.run_node(div, {k: torch.from_numpy(np.asarray(v)) for k, v in forced.items()})[0].numpy()
    a_signed = codes[a].astype(np.int64) - int(q.values[a].quant.zero_point)
    want = np.where(a_signed > 0, yq.qmax, np.where(a_signed < 0, yq.qmin, int(yq.zero_point)))
    np.testing.assert_array_equal(y, np.broadcast_to(want, y.shape))
    npuforge.save(q, tmp_path / "q.nfir")
    from npuforge.cli import main

    assert main(["compile", str(tmp_path / "q.nfir"), "-o", str(tmp_path / "q.npub")]) == 0


def test_zero_over_zero_is_the_zero_point_in_the_integer_program_and_an_error_in_fake_quant():
    """The integer rule has no NaN: 0 / 0 is the output's zero point (in the plain and the lowered
    engines alike); fake-quant's float division gives NaN there and stops, naming the node."""
    from npuforge.errors import NpuforgeError
    from npuforge.sim.fake_quant import run_fake_quant
    from test_quant_rules_37 import LinearAttentionNorm as ZeroRows, _data

    graph = npuforge.from_torch(ZeroRows().eval(), torch.zeros(1, 4, 8))
    calib = [x + 1.0 for x in _data((2, 4, 8), 0, 2)]
    q = npuforge.quantize(graph, calib, log=lambda m: None)
    div = next(n for n in q.nodes if n.op == "Div")
    x = calib[0].copy()
    x[0, 1] = -1.0  # a row of zeros after the Relu: 0 / 0
    plain = IntegerSimulator(q).run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]]
    lowered = LoweredSimulator(q, "fixedpoint", form="float").run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]]
    np.testing.assert_array_equal(plain, lowered)
    assert (plain[0, 1] == int(q.values[div.outputs[0]].quant.zero_point)).all()
    with pytest.raises(NpuforgeError, match=rf"^node '{div.name}' \(Div\) output .* NaN value\(s\)"):
        run_fake_quant(q, {q.inputs[0]: x})
