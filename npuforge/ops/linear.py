"""Matrix ops: Gemm and MatMul (numpy matmul semantics), Einsum; Trilu and EyeLike."""

import re

import numpy as np
import torch

from .activation import FUSED_ATTRS, FUSED_KINDS, apply_fused, check_fused, onnx_with_fused
from .conv import _numel
from ..ir import dtypes
from .dtype_rules import ANY, NUMERIC, require_dtype
from .registry import Op, TensorInfo, broadcast_shapes, fail, register


def _same(a, b) -> bool:
    return a == b or isinstance(a, str) or isinstance(b, str)


@register
class Gemm(Op):
    name = "Gemm"
    inputs = (2, 3)
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, **FUSED_ATTRS}
    attr_kinds = FUSED_KINDS
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


_EINSUM_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")


def _split_term(term: str) -> tuple[str, str]:
    """'ab...c' -> ('ab', 'c'): the letters before and after the ellipsis."""
    pre, _, post = term.partition("...")
    return pre, post


@register
class Einsum(Op):
    name = "Einsum"
    inputs = (1, 1 << 16)
    attrs = {"equation": ""}
    summary = "Einstein summation, numpy rules (ellipsis, implicit output, repeated letters, size-1 dims broadcast)"

    def terms(self, node, ranks: list) -> tuple[list, str]:
        """(input terms, output term): the implicit output of numpy made explicit (the ellipsis,
        then the letters used once, in alphabetical order), so the shape rule and torch agree."""
        eq = node.attrs["equation"].replace(" ", "")
        lhs, arrow, out = eq.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(ranks):
            fail(node, f"equation {eq!r} has {len(terms)} input terms for {len(ranks)} inputs")
        for t, rank in zip(terms, ranks):
            if not _EINSUM_TERM.fullmatch(t):
                fail(node, f"term {t!r} of {eq!r} is not letters with at most one '...'")
            letters = len(t.replace("...", ""))
            if letters > rank or ("..." not in t and letters != rank):
                fail(node, f"term {t!r} does not match an input of rank {rank}")
        if not arrow:
            used = "".join(terms).replace("...", "")
            out = ("..." if any("..." in t for t in terms) else "") + "".join(
                sorted(c for c in set(used) if used.count(c) == 1))
        letters = out.replace("...", "")
        if not _EINSUM_TERM.fullmatch(out) or len(set(letters)) != len(letters):
            fail(node, f"output term {out!r} of {eq!r} is not distinct letters with at most one '...'")
        missing = set(letters) - set("".join(terms))
        if missing:
            fail(node, f"output letters {''.join(sorted(missing))} of {eq!r} appear in no input")
        return terms, out

    def label_dims(self, node, terms, shapes) -> tuple[dict, tuple]:
        """Each letter's dim and the broadcast ellipsis dims; a dim of 1 broadcasts."""
        dims, ellipses = {}, []
        for t, shape in zip(terms, shapes):
            pre, post = _split_term(t)
            ell = len(shape) - len(pre) - len(post)
            ellipses.append(tuple(shape[len(pre):len(pre) + ell]))
            for c, d in zip(pre + "." * ell + post, shape):
                if c != ".":
                    dims[c] = broadcast_shapes(node, (dims.get(c, 1),), (d,))[0]
        return dims, broadcast_shapes(node, *ellipses)

    def infer(self, node, ins):
        require_dtype(node, ins[0], NUMERIC)
        if len({i.dtype for i in ins}) != 1:
            fail(node, f"inputs have different dtypes ({', '.join(i.dtype for i in ins)})")
        terms, out = self.terms(node, [len(i.shape) for i in ins])
        dims, ell = self.label_dims(node, terms, [i.shape for i in ins])
        pre, post = _split_term(out)
        shape = (*(dims[c] for c in pre), *(ell if "..." in out else ()), *(dims[c] for c in post))
        return [TensorInfo(ins[0].dtype, shape)]

    def forward(self, node, xs):
        terms, out = self.terms(node, [x.dim() for x in xs])
        return [torch.einsum(",".join(terms) + "->" + out, *xs)]

    def macs(self, node, ins, outs):
        if len(ins) < 2:
            return 0
        terms, _ = self.terms(node, [len(i.shape) for i in ins])
        dims, ell = self.label_dims(node, terms, [i.shape for i in ins])
        return int(np.prod([d if isinstance(d, int) else 1 for d in (*dims.values(), *ell)], dtype=np.int64))


@register
class Trilu(Op):
    name = "Trilu"
    inputs = (1, 2)
    attrs = {"upper": 1}
    summary = "keep the upper (or lower) triangle of the last two axes from diagonal k on, zero the rest"

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, ANY)
        if len(x.shape) < 2:
            fail(node, f"input rank {len(x.shape)}: expected at least 2")
        if len(ins) > 1 and ins[1] is not None:
            require_dtype(node, ins[1], ("int64",), "k")
            if len(ins[1].shape) > 1 or (ins[1].shape and ins[1].shape[0] != 1):
                fail(node, f"k must be a scalar, got shape {list(ins[1].shape)}")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x = xs[0]
        k = int(xs[1].reshape(-1)[0]) if len(xs) > 1 and xs[1] is not None else 0
        return [torch.triu(x, k) if node.attrs["upper"] else torch.tril(x, k)]


@register
class EyeLike(Op):
    name = "EyeLike"
    attrs = {"dtype": None, "k": 0}
    summary = "ones on diagonal k of a 2-D tensor shaped like the input, zeros elsewhere (dtype or the input's)"
    quant = "shape"

    def from_onnx(self, ctx, node):
        dtype = node.attrs["dtype"]
        where = f"node '{node.name}' (EyeLike)"
        node.attrs["dtype"] = ctx.info(node.inputs[0]).dtype if dtype is None else dtypes.from_onnx(dtype, where)

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, ANY)
        if len(x.shape) != 2:
            fail(node, f"input rank {len(x.shape)}: expected 2")
        return [TensorInfo(dtypes.check_dtype(node.attrs["dtype"] or x.dtype), x.shape)]

    def eye(self, node, rows: int, cols: int, dtype: str) -> torch.Tensor:
        diagonal = torch.arange(cols).unsqueeze(0) - torch.arange(rows).unsqueeze(1) == node.attrs["k"]
        return diagonal.to(dtypes.to_torch(dtype))

    def propagate(self, node, ins, outs):
        shape = outs[0].shape
        if all(isinstance(d, int) for d in shape) and shape[0] * shape[1] <= 1 << 16:
            return [self.eye(node, *shape, outs[0].dtype).numpy()]  # it needs only the shape
        return None

    def forward(self, node, xs):
        x = xs[0]
        return [self.eye(node, x.shape[0], x.shape[1], node.attrs["dtype"] or dtypes.from_torch(x.dtype))]

    def onnx_nodes(self, node):
        from onnx import helper

        dtype = node.attrs["dtype"]
        extra = {} if dtype is None else {"dtype": dtypes.to_onnx(dtype)}
        return [helper.make_node("EyeLike", node.inputs, node.outputs, name=node.name, k=node.attrs["k"], **extra)]
