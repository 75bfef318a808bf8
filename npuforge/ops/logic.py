"""Comparisons, logical ops and Where; Min / Max / Sum / Mean over any number
of inputs; Mod, Pow, BitShift. All broadcast numpy-style (multidirectional).

Their values propagate at import, so shape arithmetic (Mod / Equal / Where on
a static shape) gives static shapes.
"""

import functools

import numpy as np
import torch

from .dtype_rules import ANY, FLOAT, INDEX, NUMERIC, require_dtype
from .registry import REQUIRED, Op, Structural, TensorInfo, broadcast_shapes, fail, register, unsupported


def _same_dtype(node, ins, what: str = "inputs") -> str:
    dtypes = {i.dtype for i in ins}
    if len(dtypes) != 1:
        fail(node, f"{what} have different dtypes ({', '.join(i.dtype for i in ins)})")
    return ins[0].dtype


def lut_with_scalar_constants(node, graph) -> str | None:
    """"lut" when input 0 is a float activation and every other input a one-element
    constant (Pow(x, 2), Max(x, 0)): the op is then a function of x alone, and the
    quantizer tabulates its forward over every code of x with the constants as they
    are. The constants must have rank <= 1 so that the table keeps x's shape."""
    values = graph.values
    x, y = values[node.inputs[0]], values[node.outputs[0]]
    if x.is_const or x.dtype not in FLOAT or y.dtype not in FLOAT:
        return None
    for name in node.inputs[1:]:
        c = values[name]
        if not c.is_const or np.asarray(c.data).size != 1 or len(c.shape) > min(1, len(x.shape)):
            return None
    return "lut"


def minmax_of_activations(node, graph, first: int = 0) -> str | None:
    """"minmax" for a float Max / Min of activations (and constants), or Where between them (its
    operands from ``first``): each operand requantized to the output's grid, then the maximum,
    minimum or selection of the codes (quant/minmax_rule.py)."""
    values = graph.values
    ins = [values[n] for n in node.inputs[first:]]
    if values[node.outputs[0]].dtype not in FLOAT or any(v.dtype not in FLOAT for v in ins) or \
            all(v.is_const for v in ins):
        return None
    return "minmax"


# -- comparisons and logic ------------------------------------------------------------

class _Compare(Op):
    inputs = (2, 2)
    dtypes = NUMERIC

    def infer(self, node, ins):
        a, b = ins
        require_dtype(node, a, self.dtypes)
        _same_dtype(node, ins)
        return [TensorInfo("bool", broadcast_shapes(node, a.shape, b.shape))]


@register
class Equal(_Compare):
    name = "Equal"
    dtypes = ANY
    summary = "a == b (bool), numpy broadcasting; bool and integers too"

    def forward(self, node, xs):
        return [torch.eq(xs[0], xs[1])]


@register
class Less(_Compare):
    name = "Less"
    summary = "a < b (bool), numpy broadcasting"

    def forward(self, node, xs):
        return [torch.lt(xs[0], xs[1])]


@register
class LessOrEqual(_Compare):
    name = "LessOrEqual"
    summary = "a <= b (bool), numpy broadcasting"

    def forward(self, node, xs):
        return [torch.le(xs[0], xs[1])]


@register
class Greater(_Compare):
    name = "Greater"
    summary = "a > b (bool), numpy broadcasting"

    def forward(self, node, xs):
        return [torch.gt(xs[0], xs[1])]


@register
class GreaterOrEqual(_Compare):
    name = "GreaterOrEqual"
    summary = "a >= b (bool), numpy broadcasting"

    def forward(self, node, xs):
        return [torch.ge(xs[0], xs[1])]


class _Logical(_Compare):
    dtypes = ("bool",)


@register
class And(_Logical):
    name = "And"
    summary = "a and b on bool tensors, numpy broadcasting"

    def forward(self, node, xs):
        return [torch.logical_and(xs[0], xs[1])]


@register
class Or(_Logical):
    name = "Or"
    summary = "a or b on bool tensors, numpy broadcasting"

    def forward(self, node, xs):
        return [torch.logical_or(xs[0], xs[1])]


@register
class Xor(_Logical):
    name = "Xor"
    summary = "a xor b on bool tensors, numpy broadcasting"

    def forward(self, node, xs):
        return [torch.logical_xor(xs[0], xs[1])]


@register
class Not(Op):
    name = "Not"
    summary = "not x on a bool tensor"

    def infer(self, node, ins):
        require_dtype(node, ins[0], ("bool",))
        return [TensorInfo("bool", ins[0].shape)]

    def forward(self, node, xs):
        return [torch.logical_not(xs[0])]


@register
class Where(Structural):
    name = "Where"
    inputs = (3, 3)
    summary = ("x where the condition holds, else y; the three broadcast together; int8: x and y requantized to "
               "the output grid, then selected")

    def infer(self, node, ins):
        cond, x, y = ins
        require_dtype(node, cond, ("bool",), "condition")
        dtype = _same_dtype(node, [x, y], "x and y")
        return [TensorInfo(dtype, broadcast_shapes(node, cond.shape, x.shape, y.shape))]

    def quant_kind(self, node, graph):
        """A selection between activations (an If on a score, imported as both branches and a
        Where): "minmax", each operand requantized to the output's grid, then selected."""
        return minmax_of_activations(node, graph, first=1)

    def quantize_integers(self, graph, node, add, config=None):
        from ..quant.minmax_rule import quantize_integers

        quantize_integers(graph, node, add, config)

    def integer_forward(self, sim, node, env):
        from ..quant.minmax_rule import integer_forward

        return integer_forward(sim, node, env)

    def np_forward(self, node, values, outs):
        # a selection: symbolic dims in x or y (object arrays) flow through it
        cond = values[0]
        if cond.dtype == object:
            return None
        return [np.where(cond, values[1], values[2])]

    def forward(self, node, xs):
        return [torch.where(xs[0], xs[1], xs[2])]


# -- Min, Max, Sum, Mean ------------------------------------------------------------------

class _Variadic(Op):
    inputs = (1, 1 << 16)
    dtypes = NUMERIC

    def infer(self, node, ins):
        require_dtype(node, ins[0], self.dtypes)
        dtype = _same_dtype(node, ins)
        return [TensorInfo(dtype, broadcast_shapes(node, *(i.shape for i in ins)))]

    def combine(self, a, b):
        raise NotImplementedError

    def forward(self, node, xs):
        y = functools.reduce(self.combine, xs)
        if len(xs) == 1:
            y = y.clone()
        return [y]


@register
class Max(_Variadic):
    name = "Max"
    summary = ("elementwise maximum of 1 or more inputs, numpy broadcasting; integers too; int8: each operand "
               "requantized to the output grid (a table with a scalar constant)")
    quant = "minmax"  # quant/minmax_rule.py

    def combine(self, a, b):
        return torch.maximum(a, b)

    def quant_kind(self, node, graph):
        return lut_with_scalar_constants(node, graph) or minmax_of_activations(node, graph)

    def quantize_integers(self, graph, node, add, config=None):
        from ..quant.minmax_rule import quantize_integers

        quantize_integers(graph, node, add, config)

    def integer_forward(self, sim, node, env):
        from ..quant.minmax_rule import integer_forward

        return integer_forward(sim, node, env)


@register
class Min(_Variadic):
    name = "Min"
    summary = ("elementwise minimum of 1 or more inputs, numpy broadcasting; integers too; int8: each operand "
               "requantized to the output grid (a table with a scalar constant)")
    quant = "minmax"  # quant/minmax_rule.py

    def combine(self, a, b):
        return torch.minimum(a, b)

    def quant_kind(self, node, graph):
        return lut_with_scalar_constants(node, graph) or minmax_of_activations(node, graph)

    def quantize_integers(self, graph, node, add, config=None):
        from ..quant.minmax_rule import quantize_integers

        quantize_integers(graph, node, add, config)

    def integer_forward(self, sim, node, env):
        from ..quant.minmax_rule import integer_forward

        return integer_forward(sim, node, env)


@register
class Sum(_Variadic):
    name = "Sum"
    dtypes = FLOAT
    summary = "elementwise sum of 1 or more inputs, numpy broadcasting"

    def combine(self, a, b):
        return a + b


@register
class Mean(Sum):
    name = "Mean"
    summary = "elementwise mean of 1 or more inputs, numpy broadcasting"

    def forward(self, node, xs):
        return [super().forward(node, xs)[0] / len(xs)]


# -- Mod, Pow, BitShift ----------------------------------------------------------------------

@register
class Mod(Op):
    name = "Mod"
    inputs = (2, 2)
    attrs = {"fmod": 0}
    summary = "remainder, numpy broadcasting: fmod=0 (integers) takes the divisor's sign, fmod=1 the dividend's"

    def infer(self, node, ins):
        a, b = ins
        require_dtype(node, a, NUMERIC)
        dtype = _same_dtype(node, ins)
        if node.attrs["fmod"] not in (0, 1):
            fail(node, f"fmod {node.attrs['fmod']} is not 0 or 1")
        if dtype in FLOAT and not node.attrs["fmod"]:
            fail(node, "a float Mod needs fmod=1 (ONNX: fmod=0 is for integers)")
        return [TensorInfo(dtype, broadcast_shapes(node, a.shape, b.shape))]

    def forward(self, node, xs):
        a, b = xs
        if node.attrs["fmod"]:
            return [torch.fmod(a, b)]
        return [torch.remainder(a, b)]  # floored: the result has the divisor's sign, as Python's %


@register
class Pow(Op):
    name = "Pow"
    inputs = (2, 2)
    summary = "x ** y in x's dtype, numpy broadcasting; integer results of negative / fractional powers truncate"

    def infer(self, node, ins):
        x, y = ins
        require_dtype(node, x, INDEX + FLOAT, "base")
        require_dtype(node, y, NUMERIC, "exponent")
        return [TensorInfo(x.dtype, broadcast_shapes(node, x.shape, y.shape))]

    def quant_kind(self, node, graph):
        return lut_with_scalar_constants(node, graph)

    def forward(self, node, xs):
        x, y = xs
        if x.dtype.is_floating_point:
            # a wider float exponent computes in its precision, then rounds to x's dtype
            wide = torch.promote_types(x.dtype, y.dtype) if y.dtype.is_floating_point else x.dtype
            return [torch.pow(x.to(wide), y.to(wide)).to(x.dtype)]
        if y.dtype.is_floating_point:
            # the real power, converted to x's integer type as C converts: toward zero
            return [torch.trunc(torch.pow(x.to(torch.float64), y.to(torch.float64))).to(x.dtype)]
        x64, y64 = x.to(torch.int64), y.to(torch.int64)
        power = torch.pow(x64, y64.clamp(min=0))
        # x ** -n = 1 / x ** n, truncated: 1 for x = 1, +-1 for x = -1, 0 for |x| > 1 (x = 0 is undefined)
        inverse = torch.where(x64 == 1, 1, torch.where(x64 == -1, 1 - 2 * (y64.abs() % 2), 0))
        return [torch.where(y64 >= 0, power, inverse).to(x.dtype)]


@register
class BitShift(Op):
    name = "BitShift"
    inputs = (2, 2)
    attrs = {"direction": REQUIRED}
    summary = "x << y or x >> y on uint8 (direction LEFT / RIGHT); bits shifted out are lost"

    def from_onnx(self, ctx, node):
        if node.attrs["direction"] not in ("LEFT", "RIGHT"):
            fail(node, f"direction {node.attrs['direction']!r} is not LEFT or RIGHT")

    def infer(self, node, ins):
        x, y = ins
        if x.dtype != "uint8" or y.dtype != "uint8":
            unsupported(node, f"{x.dtype} and {y.dtype} inputs: only uint8 is supported (the IR has no "
                              f"uint16/32/64)")
        return [TensorInfo("uint8", broadcast_shapes(node, x.shape, y.shape))]

    def forward(self, node, xs):
        x = xs[0].to(torch.int64)
        y = xs[1].to(torch.int64).clamp(max=8)  # a shift by 8 or more leaves 0 either way
        if node.attrs["direction"] == "LEFT":
            return [(x << y).bitwise_and(0xFF).to(torch.uint8)]
        return [(x >> y).to(torch.uint8)]
