"""Matrix products: Gemm and MatMul (numpy matmul semantics)."""

import torch

from .activation import FUSED_ATTRS, apply_fused, check_fused, onnx_with_fused
from .conv import _numel
from .registry import Op, TensorInfo, broadcast_shapes, fail, register


def _same(a, b) -> bool:
    return a == b or isinstance(a, str) or isinstance(b, str)


@register
class Gemm(Op):
    name = "Gemm"
    inputs = (2, 3)
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, **FUSED_ATTRS}
    summary = "alpha * A' @ B' + beta * C, C broadcast to the [M, N] output; optional fused activation"
    quant = "compute"

    def quant_kind(self, node, graph):
        a = node.attrs
        plain = a["alpha"] == 1.0 and a["beta"] == 1.0 and not a["transA"]
        return "compute" if plain and graph.values[node.inputs[1]].is_const else None

    def weight_axis(self, node, graph):
        return 0 if node.attrs["transB"] else 1

    def onnx_nodes(self, node):
        return onnx_with_fused(node)

    def infer(self, node, ins):
        a, b = ins[0], ins[1]
        if len(a.shape) != 2 or len(b.shape) != 2:
            fail(node, f"A and B must be 2-D, got {list(a.shape)} and {list(b.shape)}")
        m, ka = a.shape[::-1] if node.attrs["transA"] else a.shape
        kb, n = b.shape[::-1] if node.attrs["transB"] else b.shape
        check_fused(node, n)
        if not _same(ka, kb):
            fail(node, f"inner dimensions differ: A {list(a.shape)} and B {list(b.shape)}")
        if len(ins) > 2 and ins[2] is not None:
            c = ins[2].shape
            if len(c) > 2 or broadcast_shapes(node, c, (m, n)) != (m, n):
                fail(node, f"C shape {list(c)} does not broadcast to the output [{m}, {n}]")
        return [TensorInfo(a.dtype, (m, n))]

    def forward(self, node, xs):
        a, b = xs[0], xs[1]
        at = node.attrs
        if at["transA"]:
            a = a.t()
        if at["transB"]:
            b = b.t()
        y = a @ b
        if at["alpha"] != 1.0:
            y = y * at["alpha"]
        if len(xs) > 2 and xs[2] is not None:
            c = xs[2] if at["beta"] == 1.0 else xs[2] * at["beta"]
            y = y + c
        return [apply_fused(node, y)]

    def macs(self, node, ins, outs):
        a = ins[0].shape
        k = a[0] if node.attrs["transA"] else a[1]
        return _numel(outs[0].shape) * (k if isinstance(k, int) else 1)


@register
class MatMul(Op):
    name = "MatMul"
    inputs = (2, 2)
    summary = "numpy matmul: 1-D operands promoted, batch dims broadcast"

    def quant_kind(self, node, graph):
        w = graph.values[node.inputs[1]]
        if w.is_const:
            return "compute" if len(w.shape) == 2 else None
        return "matmul"

    def weight_axis(self, node, graph):
        return 1

    def infer(self, node, ins):
        a, b = ins[0].shape, ins[1].shape
        if not a or not b:
            fail(node, "operands must have rank >= 1")
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        if not _same(a2[-1], b2[-2]):
            fail(node, f"inner dimensions differ: {list(a)} @ {list(b)}")
        batch = broadcast_shapes(node, a2[:-2], b2[:-2])
        out = (*batch, a2[-2], b2[-1])
        if len(a) == 1:
            out = out[:-2] + out[-1:]
        if len(b) == 1:
            out = out[:-1]
        return [TensorInfo(ins[0].dtype, out)]

    def forward(self, node, xs):
        return [torch.matmul(xs[0], xs[1])]

    def macs(self, node, ins, outs):
        k = ins[0].shape[-1]
        return _numel(outs[0].shape) * (k if isinstance(k, int) else 1)
