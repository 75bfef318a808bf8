"""Binary arithmetic with numpy broadcasting: Add, Sub, Mul, Div, SquaredDifference."""

import torch

from .registry import Op, TensorInfo, broadcast_shapes, fail, register


class _Binary(Op):
    inputs = (2, 2)
    quant = "elementwise"

    def quant_kind(self, node, graph):
        # integer arithmetic (shape computations) stays as it is
        return self.quant if graph.values[node.outputs[0]].dtype in ("float16", "float32", "float64") else "shape"

    def infer(self, node, ins):
        a, b = ins
        if a.dtype != b.dtype:
            fail(node, f"input dtypes differ ({a.dtype} and {b.dtype})")
        return [TensorInfo(a.dtype, broadcast_shapes(node, a.shape, b.shape))]


@register
class Add(_Binary):
    name = "Add"
    summary = "a + b, numpy broadcasting"

    def forward(self, node, xs):
        return [xs[0] + xs[1]]


@register
class Sub(_Binary):
    name = "Sub"
    summary = "a - b, numpy broadcasting"

    def forward(self, node, xs):
        return [xs[0] - xs[1]]


@register
class Mul(_Binary):
    name = "Mul"
    summary = "a * b, numpy broadcasting"

    def forward(self, node, xs):
        return [xs[0] * xs[1]]


@register
class Div(_Binary):
    name = "Div"
    summary = ("a / b, numpy broadcasting; integers truncate toward zero; int8: the exact quotient of the codes "
               "times the ratio of scales, rounded once (quant/div_rule.py)")
    quant = "divide"  # by an activation; a constant divisor becomes a Mul first (passes/div_by_constant.py)

    def quant_kind(self, node, graph):
        values = graph.values
        if values[node.outputs[0]].dtype not in ("float16", "float32", "float64"):
            return "shape"
        return None if all(values[n].is_const for n in node.inputs) else "divide"

    def quantize_integers(self, graph, node, add, config=None):
        from ..quant.div_rule import quantize_integers

        quantize_integers(graph, node, add, config)

    def integer_forward(self, sim, node, env):
        from ..quant.div_rule import integer_forward

        return integer_forward(sim, node, env)

    def forward(self, node, xs):
        a, b = xs
        if a.dtype.is_floating_point:
            return [a / b]
        return [torch.div(a, b, rounding_mode="trunc")]


@register
class SquaredDifference(_Binary):
    name = "SquaredDifference"
    summary = ("(a - b)^2, numpy broadcasting: TFLite's SQUARED_DIFFERENCE as an int8 .tflite gives it (a float "
               "file's imports as Sub and Mul); int8: LiteRT's kernel (quant/tflite_elementwise.py)")
    quant = "squared_difference"

    def forward(self, node, xs):
        d = xs[0] - xs[1]
        return [d * d]

    def onnx_nodes(self, node):
        from onnx import helper

        d = f"{node.outputs[0]}::difference"
        return [helper.make_node("Sub", node.inputs[:2], [d], name=f"{node.name}::sub"),
                helper.make_node("Mul", [d, d], node.outputs[:1], name=node.name)]

    def quantize_integers(self, graph, node, add):
        from ..quant.tflite_elementwise import quantize_integers

        quantize_integers(graph, node, add)

    def integer_forward(self, sim, node, env):
        from ..quant.tflite_elementwise import integer_forward

        return integer_forward(sim, node, env)
