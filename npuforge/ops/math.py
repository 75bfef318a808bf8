"""Unary math: Erf, Sqrt, Exp, Log, Reciprocal, the trigonometric and hyperbolic
functions and their inverses, Floor / Ceil / Round (float only, each a lookup
table when quantized); Abs / Neg / Sign (integers too); IsNaN / IsInf.

Floor, Ceil and Round also serve shape arithmetic (Div -> Ceil -> Cast on a
static shape): their values propagate at import through the base rule.
"""

import torch

from .activation import _NumericUnary, _Unary
from .dtype_rules import FLOAT, SIGNED, require_dtype
from .registry import Op, TensorInfo, register


@register
class Erf(_Unary):
    name = "Erf"
    summary = "the error function erf(x)"

    def forward(self, node, xs):
        return [torch.erf(xs[0])]


@register
class Sqrt(_Unary):
    name = "Sqrt"
    summary = "square root (NaN below 0)"

    def forward(self, node, xs):
        return [torch.sqrt(xs[0])]


@register
class Exp(_Unary):
    name = "Exp"
    summary = "exp(x)"

    def forward(self, node, xs):
        return [torch.exp(xs[0])]


@register
class Log(_Unary):
    name = "Log"
    summary = "natural logarithm (NaN below 0, -inf at 0)"

    def forward(self, node, xs):
        return [torch.log(xs[0])]


@register
class Reciprocal(_Unary):
    name = "Reciprocal"
    summary = "1 / x"

    def forward(self, node, xs):
        return [torch.reciprocal(xs[0])]


@register
class Sin(_Unary):
    name = "Sin"
    summary = "sin(x)"

    def forward(self, node, xs):
        return [torch.sin(xs[0])]


@register
class Cos(_Unary):
    name = "Cos"
    summary = "cos(x)"

    def forward(self, node, xs):
        return [torch.cos(xs[0])]


@register
class Tan(_Unary):
    name = "Tan"
    summary = "tan(x)"

    def forward(self, node, xs):
        return [torch.tan(xs[0])]


@register
class Asin(_Unary):
    name = "Asin"
    summary = "arcsine (NaN outside [-1, 1])"

    def forward(self, node, xs):
        return [torch.asin(xs[0])]


@register
class Acos(_Unary):
    name = "Acos"
    summary = "arccosine (NaN outside [-1, 1])"

    def forward(self, node, xs):
        return [torch.acos(xs[0])]


@register
class Atan(_Unary):
    name = "Atan"
    summary = "arctangent"

    def forward(self, node, xs):
        return [torch.atan(xs[0])]


@register
class Sinh(_Unary):
    name = "Sinh"
    summary = "sinh(x)"

    def forward(self, node, xs):
        return [torch.sinh(xs[0])]


@register
class Cosh(_Unary):
    name = "Cosh"
    summary = "cosh(x)"

    def forward(self, node, xs):
        return [torch.cosh(xs[0])]


@register
class Asinh(_Unary):
    name = "Asinh"
    summary = "inverse hyperbolic sine"

    def forward(self, node, xs):
        return [torch.asinh(xs[0])]


@register
class Acosh(_Unary):
    name = "Acosh"
    summary = "inverse hyperbolic cosine (NaN below 1)"

    def forward(self, node, xs):
        return [torch.acosh(xs[0])]


@register
class Atanh(_Unary):
    name = "Atanh"
    summary = "inverse hyperbolic tangent (NaN outside [-1, 1])"

    def forward(self, node, xs):
        return [torch.atanh(xs[0])]


@register
class Floor(_Unary):
    name = "Floor"
    summary = "round down to an integer value (float in, float out)"

    def forward(self, node, xs):
        return [torch.floor(xs[0])]


@register
class Ceil(_Unary):
    name = "Ceil"
    summary = "round up to an integer value (float in, float out)"

    def forward(self, node, xs):
        return [torch.ceil(xs[0])]


@register
class Round(_Unary):
    name = "Round"
    summary = "round to the nearest integer value, halves to even (2.5 -> 2)"

    def forward(self, node, xs):
        return [torch.round(xs[0])]  # torch rounds halves to even, as ONNX does


@register
class Abs(_NumericUnary):
    name = "Abs"
    summary = "|x|; integers too (the most negative value stays itself, as in two's complement)"

    def forward(self, node, xs):
        return [torch.abs(xs[0])]


@register
class Neg(_NumericUnary):
    name = "Neg"
    dtypes = SIGNED + FLOAT  # ONNX has no unsigned Neg
    summary = "-x; signed integers too"

    def forward(self, node, xs):
        return [torch.neg(xs[0])]


@register
class Sign(_NumericUnary):
    name = "Sign"
    summary = "-1, 0 or 1 by the sign of x, in x's dtype; integers too"

    def forward(self, node, xs):
        return [torch.sign(xs[0])]


class _FloatTest(Op):
    """A float -> bool classification of each element."""

    def infer(self, node, ins):
        require_dtype(node, ins[0], FLOAT)
        return [TensorInfo("bool", ins[0].shape)]


@register
class IsNaN(_FloatTest):
    name = "IsNaN"
    summary = "true where x is NaN"

    def forward(self, node, xs):
        return [torch.isnan(xs[0])]


@register
class IsInf(_FloatTest):
    name = "IsInf"
    attrs = {"detect_negative": 1, "detect_positive": 1}
    summary = "true where x is +inf (detect_positive) or -inf (detect_negative)"

    def forward(self, node, xs):
        x = xs[0]
        hit = torch.zeros(x.shape, dtype=torch.bool)
        if node.attrs["detect_positive"]:
            hit |= torch.isposinf(x)
        if node.attrs["detect_negative"]:
            hit |= torch.isneginf(x)
        return [hit]
