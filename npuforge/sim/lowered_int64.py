"""The float lowering (:mod:`npuforge.sim.lowered`) of the rules that are integer programs
rather than one requantization: Softmax (npuforge/quant/softmax_rule.py) and
LayerNormalization / InstanceNormalization / L2Normalize (npuforge/quant/layernorm_rule.py);
the fixed-point requantization itself (:func:`requantize`), for the channels no float formula
is proven equal to; Add / Sub / Mul of operands too wide for a table of every pair of codes
(:func:`elementwise`: int16); and the integer bilinear Resize (:func:`interpolate`). Each is
computed exactly, step for step as the plain simulator computes it or in a regrouping that
gives the same integers: in float64 where every value is an integer (or one times a power of
two) below 2^53, whatever the order of the sums, else in ONNX Runtime's int64 arithmetic,
whose products stay below 2^62 by the rules' own bounds. ``Div`` of non-negative int64 values
is floor division; a floor division by 2^t of a signed value is ``(a + 2^62) >> t`` as uint64
less ``2^(62 - t)`` where the value's bound allows, else ``(a - Mod(a, 2^t)) / 2^t``; the
integer square root is a float64 estimate biased below, corrected by one step upward, and the
normalization's ``isqrt(2^60 // D)`` for D below 2^23 one float64 ``floor(2^30 / sqrt(D))``.

Each function takes the builder (its ``emit``, ``const``, ``activation``, ``plain``)
and the node, emits into the node's output (values ``q - zp`` in float32, as the
rest of the float lowering), and returns a one-line description.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from onnx import TensorProto

from ..quant import layernorm_rule
from ..quant.requant import extra_bits
from .int_ops import max_abs_code


def _int64(builder, name: str, value) -> str:
    return builder.const(name, np.asarray(value, np.int64))


def _store(builder, node, q64: str, in_float32: bool = False) -> None:
    """int64 codes without the zero point (float32 ones with ``in_float32``) -> the node's float32
    output, clamped to its type."""
    yq = builder.activation(node, node.outputs[0])
    zp = int(yq.zero_point)
    q = q64 if in_float32 else builder.emit("Cast", [q64], f"{node.name}::q", to=TensorProto.FLOAT)
    builder._clamp(node, q, np.array([yq.qmin - zp]), np.array([yq.qmax - zp]), [-1])


FLOAT64_INTEGERS = 1 << 53  # every integer below this is a float64
FLOAT32_INTEGERS = 1 << 24  # and a float32


def softmax(builder, node) -> str:
    """The integer Softmax: ``d = q - max(q)``, ``e = EXP[d + L - 1]``, ``S = sum(e)``, ``y = floor((2 e R +
    S 2^m) / (2 S 2^m))``. Where the numerator stays below 2^53 (an axis of static length n with
    2 max(e) R + n max(e) 2^m below it), in float64: e from a double table rolled so that
    ``GatherElements`` reads it at d itself (negative indices count from the end), S a vectorized
    ReduceSum, and ``floor((e R / 2^m + S / 2) / S)``: an exact numerator over an exact
    denominator, whose correctly rounded quotient has the same floor (it is at least 1/(2 S 2^m)
    from the next integer, more than its rounding error). Otherwise in int64, step for step."""
    if "tflite_softmax" in node.quant:
        builder.refuse(node, "TFLite's fixed-point SOFTMAX is not lowered")
    builder.activation(node, node.inputs[0])
    x, pre, plain = node.inputs[0], node.name, builder.plain
    axes = _int64(builder, f"{pre}::axes", [node.attrs["axis"]])
    table = plain._int(node, "exp").astype(np.int64)
    r, m = int(plain._int(node, "multiplier")), int(plain._int(node, "shift"))
    top = builder.emit("ReduceMax", [x, axes], f"{pre}::max", keepdims=1)
    d = builder.emit("Sub", [x, top], f"{pre}::d")  # exact: integers in float32
    n = builder.graph.values[x].shape[node.attrs["axis"]]
    e_max = int(table.max(initial=0))
    if isinstance(n, int) and 2 * e_max * r + n * e_max * (1 << m) < FLOAT64_INTEGERS:
        index = builder.emit("Cast", [d], f"{pre}::ix", to=TensorProto.INT32)
        if n >= ROW_TABLE_MIN * len(table) and n * e_max < INT32_SUMS:
            return _softmax_row_tables(builder, node, table, r, m, index, axes)
        e = builder.lookup(builder.const(f"{pre}::exp64", np.roll(table.astype(np.float64), 1)), index, f"{pre}::e",
                           like=x)
        total = builder.emit("ReduceSum", [e, axes], f"{pre}::sum", keepdims=1)
        num = builder.emit("Add", [builder.emit("Mul", [e, builder.const(f"{pre}::r_2m", np.float64(r * 2.0**-m))],
                                                f"{pre}::er"),
                                   builder.emit("Mul", [total, builder.const("float64_half", 0.5)], f"{pre}::s_half")],
                           f"{pre}::num")
        q = builder.emit("Floor", [builder.emit("Div", [num, total], f"{pre}::ratio")], f"{pre}::q64")
        _store(builder, node, q)
        return "float64 softmax"
    index = builder.emit("Add", [d, builder.const(f"{pre}::last", np.float32(len(table) - 1))], f"{pre}::ix_f")
    index = builder.emit("Cast", [index], f"{pre}::ix", to=TensorProto.INT32)
    e = builder.lookup(builder.const(f"{pre}::exp", table), index, f"{pre}::e", like=x)
    total = builder.emit("ReduceSum", [e, axes], f"{pre}::sum", keepdims=1)
    num = builder.emit("Add", [builder.emit("Mul", [e, _int64(builder, f"{pre}::2r", 2 * r)], f"{pre}::2er"),
                               builder.emit("Mul", [total, _int64(builder, f"{pre}::2m", 1 << m)], f"{pre}::s2m")],
                       f"{pre}::num")
    den = builder.emit("Mul", [total, _int64(builder, f"{pre}::2m1", 1 << (m + 1))], f"{pre}::den")
    _store(builder, node, builder.emit("Div", [num, den], f"{pre}::q64"))
    return "int64 softmax"


R_ABOVE_SHIFT = math.isqrt((1 << layernorm_rule.NUMERATOR_BITS) >> 21)  # r's largest value once h >= 1 (D_h >= 2^21)


ROW_TABLE_MIN = 2  # rows at least this many times the exponential table's length: a table of outputs per row
INT32_SUMS = 1 << 31  # a row table's exponentials are summed in int32: n max(e) below this


def _softmax_row_tables(builder, node, table, r: int, m: int, index: str, axes: str) -> str:
    """Rows much longer than the L-entry exponential table (high-resolution attention): each row's L
    possible outputs ``floor((e R / 2^m + S / 2) / S)``, clamped, computed once as a table of the
    input's shape with L along the axis (float64, exact as in :func:`softmax`) and read at each
    element's d by ``GatherElements`` on that axis: the quotient, its floor and the clamp run over L
    values per row instead of n."""
    pre = node.name
    yq = builder.activation(node, node.outputs[0])
    zp = int(yq.zero_point)
    rank = len(builder.graph.values[node.inputs[0]].shape)
    axis = node.attrs["axis"] % rank
    e = builder.lookup(builder.const(f"{pre}::exp32", np.roll(table.astype(np.int32), 1)), index, f"{pre}::e",
                       like=node.inputs[0])
    total = builder.emit("Cast", [builder.emit("ReduceSum", [e, axes], f"{pre}::sum32", keepdims=1)], f"{pre}::sum",
                         to=TensorProto.DOUBLE)
    scaled = builder.const(f"{pre}::exp_r_2m", (np.roll(table.astype(np.float64), 1) * (r * 2.0**-m))
                           .reshape((-1,) + (1,) * (rank - 1 - axis)))
    num = builder.emit("Add", [scaled, builder.emit("Mul", [total, builder.const("float64_half", 0.5)],
                                                    f"{pre}::s_half")], f"{pre}::row_num")
    q = builder.emit("Floor", [builder.emit("Div", [num, total], f"{pre}::row_ratio")], f"{pre}::row_q64")
    rows = builder.emit("Clip", [builder.emit("Cast", [q], f"{pre}::row_q", to=TensorProto.FLOAT),
                                 builder.const(f"{pre}::lo", np.float32(yq.qmin - zp)),
                                 builder.const(f"{pre}::hi", np.float32(yq.qmax - zp))], f"{pre}::row_table")
    builder.emit("GatherElements", [rows, index], node.outputs[0], axis=axis)
    return "float64 softmax, a table per row"


def layernorm(builder, node) -> str:
    """npuforge/quant/layernorm_rule.py's integer normalization in the cheapest form its bounds
    allow (:class:`_Normalization`)."""
    return _Normalization(builder, node).lower()


ROWS_BELOW = 1 << 23  # N m below this: u from x and S without c (x N r and S r below 2^53, r <= 2^30)


class _Normalization:
    """One LayerNormalization / InstanceNormalization / L2Normalize, lowered. Bounds first, from N,
    the input's codes (m = max |q - zp|) and the IR's integers; then each step in the fastest exact
    type: D (:meth:`d`), h (:meth:`h`), r (:meth:`r`), u (:meth:`u`), the output (:meth:`output`).
    Every float64 form keeps each value an integer (or one times a power of two) below 2^53."""

    def __init__(self, builder, node):
        self.b, self.node, self.pre, plain = builder, node, node.name, builder.plain
        xq = builder.activation(node, node.inputs[0])
        self.x = node.inputs[0]  # q - zp in float32
        self.dims, n, _ = layernorm_rule._geometry(builder.graph, node)
        self.n, self.m = n, max_abs_code(xq)
        self.axes = _int64(builder, f"{self.pre}::axes", list(self.dims))
        # the sums in float where every partial sum is an integer the type holds (N m^2 below 2^24 or 2^53),
        # whatever the order ONNX Runtime adds in: its float ReduceSum is vectorized, int64's not
        self.squares_max = n * self.m ** 2
        self.exact = TensorProto.FLOAT if self.squares_max < FLOAT32_INTEGERS else \
            TensorProto.DOUBLE if self.squares_max < FLOAT64_INTEGERS else None
        self.eps = int(plain._int(node, "epsilon"))
        self.centred = layernorm_rule.centred(node)
        self.c_max = n * (int(xq.qmax) - int(xq.qmin)) if self.centred else self.m
        # W = N^2 var <= (N (qmax - qmin) / 2)^2 (Popoviciu), the partial sums of c^2 <= sum(c^2) = N W
        w_max = self.c_max ** 2 // 4 + 1
        self.d_max = w_max + self.eps if self.centred else max(self.squares_max, self.eps)
        # D exact in float64: W's partial sums (centred) or the squares' (L2Normalize: exact where self.exact is)
        self.float64_d = self.exact is not None and self.d_max < FLOAT64_INTEGERS and \
            (not self.centred or n * w_max < FLOAT64_INTEGERS)
        # |c r| <= sqrt(N) 2^30 where h = 0 (c^2 <= N W <= N D, r <= 2^30 / sqrt(D)), else c_max isqrt(2^60 / 2^21):
        # below 2^53, c times r / 2^(h + down) (a power of two apart from r) is exact in float64, and so its Floor
        self.float64_u = self.exact is not None and max((math.isqrt(n) + 1) << 30, self.c_max * R_ABOVE_SHIFT) < 1 << 53
        # no c at all: u = floor(x N rs - S rs), both products exact and so their difference, c rs; W = N sum(x^2) - S^2
        # per slice, S and (N m^2 below 2^24) sum(x^2) in float32. Four float64 passes over the input where c took five
        self.rows = self.centred and self.float64_d and self.float64_u and n * self.m < ROWS_BELOW
        self.down = layernorm_rule.down_shift(n)
        self.g, self.bias = plain._int(node, "scale").astype(np.int64), plain._int(node, "bias").astype(np.int64)
        self.t = int(plain._int(node, "shift"))

    def emit(self, op: str, inputs: list, tag: str, **attrs) -> str:
        return self.b.emit(op, inputs, f"{self.pre}::{tag}", **attrs)

    def const(self, tag: str, value) -> str:
        return self.b.const(f"{self.pre}::{tag}", value)

    def lower(self) -> str:
        d = self.d()
        self.h(d)
        u = self.u(self.r(d))
        return self.output(u)

    def d(self) -> str:
        """D per slice: float64 (exact) where :attr:`float64_d`, else int64. Sets what :meth:`u` reads."""
        x, b = self.x, self.b
        if self.rows:
            self.x64 = _as_double(b, x, TensorProto.FLOAT, f"{self.pre}::x64")
            self.total = self.emit("Cast", [self.emit("ReduceSum", [x, self.axes], "sum", keepdims=1)], "s64",
                                   to=TensorProto.DOUBLE)
            x2 = x if self.squares_max < FLOAT32_INTEGERS else self.x64
            squares = self.emit("ReduceSum", [self.emit("Mul", [x2, x2], "x2"), self.axes], "sumsq", keepdims=1)
            if x2 == x:
                squares = self.emit("Cast", [squares], "sumsq64", to=TensorProto.DOUBLE)
            self.n64 = self.const("n64", np.float64(self.n))
            w = self.emit("Sub", [self.emit("Mul", [squares, self.n64], "nsumsq"),
                                  self.emit("Mul", [self.total, self.total], "s2")], "w")
            return self.emit("Add", [w, self.const("eps64", np.float64(self.eps))], "d64")
        # c's type: S and c in float32 where they stay below 2^24 (deit's int16 inputs too), half float64's passes
        self.c_type = self.exact  # (L2Normalize: its squares' type)
        if self.centred and self.float64_d and self.n * self.m < FLOAT32_INTEGERS and self.c_max < FLOAT32_INTEGERS:
            self.c_type = TensorProto.FLOAT
        if self.c_type == TensorProto.FLOAT:
            xf = x
        elif self.c_type == TensorProto.DOUBLE:
            xf = _as_double(b, x, TensorProto.FLOAT, f"{self.pre}::x64")
        else:
            xf = self.emit("Cast", [x], "q_in", to=TensorProto.INT64)  # q - zp: the zero point cancels in c
        eps = _int64(b, f"{self.pre}::eps", self.eps)
        if not self.centred:  # L2Normalize: c = q - zp, D = max(sum(c^2), E)
            squares = self.emit("ReduceSum", [self.emit("Mul", [xf, xf], "q2"), self.axes], "sumsq", keepdims=1)
            self.c = xf
            if self.float64_d:  # then r from D in float64: three nodes per slice where isqrt's int64 steps took ten
                squares = _as_double(b, squares, self.c_type, f"{self.pre}::sumsq64")
                return self.emit("Max", [squares, self.const("eps64", np.float64(self.eps))], "d64")
            squares = self.emit("Cast", [squares], "sumsq_i", to=TensorProto.INT64) if self.exact else squares
            return self.emit("Max", [squares, eps], "d")
        # c = N q - S: |c| <= N (qmax - qmin); in the sums' float type that is exact (c's bound below its 2^24 or 2^53)
        total = self.emit("ReduceSum", [xf, self.axes], "sum", keepdims=1)
        self.c = self.emit("Sub", [self.emit("Mul", [xf, _float(b, f"{self.pre}::n", self.n, self.c_type)], "nq"),
                                   total], "c")
        if self.float64_d:
            # D = sum(c^2) / N + E, every partial sum and D integers below 2^53 in float64 (Mul then ReduceSum:
            # ONNX Runtime's ReduceSumSquare made deit_tiny, bert_tiny and convnext_atto 3-5 % slower)
            c64 = _as_double(b, self.c, self.c_type, f"{self.pre}::c64")
            sum_c2 = self.emit("ReduceSum", [self.emit("Mul", [c64, c64], "c2"), self.axes], "sumc2", keepdims=1)
            w = self.emit("Div", [sum_c2, self.const("n64", np.float64(self.n))], "w")
            return self.emit("Add", [w, self.const("eps64", np.float64(self.eps))], "d64")

        def reduce(v: str, tag: str) -> str:
            summed = self.emit("ReduceSum", [v, self.axes], tag, keepdims=1)
            return self.emit("Cast", [summed], f"{tag}_i", to=TensorProto.INT64) if self.exact else summed

        squares = reduce(self.emit("Mul", [xf, xf], "q2"), "sumsq")
        total = self.emit("Cast", [total], "sum_i", to=TensorProto.INT64) if self.exact else total
        nsumsq = self.emit("Mul", [squares, _float(b, f"{self.pre}::n", self.n, None)], "nsumsq")
        w = self.emit("Sub", [nsumsq, self.emit("Mul", [total, total], "s2")], "w")
        return self.emit("Add", [w, eps], "d")

    def h(self, d: str) -> None:
        """h = #{j: d >= 2^(21 + 2j)} over the limits d can reach (none: h is 0): d against them on its last
        axis where that is a normalized one (size 1), else on a new one."""
        self.limits = [v for v in layernorm_rule.SHIFT_LIMITS if v <= self.d_max]
        self.h_name = None
        if not self.limits:
            return
        last = _int64(self.b, f"{self.pre}::last_axis", [-1])
        last_normalized = len(self.b.graph.values[self.x].shape) - 1 in self.dims
        d1 = d if last_normalized else self.emit("Unsqueeze", [d, last], "d1")
        bounds = self.const("limits", np.array(self.limits, np.float64 if self.float64_d else np.int64))
        above = self.emit("Cast", [self.emit("GreaterOrEqual", [d1, bounds], "above")], "above64", to=TensorProto.INT64)
        self.h_name = self.emit("ReduceSum", [above, last], "h", keepdims=int(last_normalized))

    def of_h(self, tag: str, table) -> str:
        """A per-slice factor that depends on h alone: its table read at h (the constant where h is 0)."""
        table = np.asarray(table)
        if self.h_name is None:
            return self.const(f"{tag}0", table[:1].reshape(()))
        return self.emit("Gather", [self.const(tag, table), self.h_name], f"{tag}_h", axis=0)

    def r(self, d: str) -> str:
        """r = isqrt(2^60 // D_h), D_h = d // 4^h."""
        k = np.arange(len(self.limits) + 1)
        if self.float64_d and self.float64_u:
            # per slice in float64, d exact: D_h = floor(d / 4^h), below 2^23, then r. 13 nodes per slice where the
            # int64 steps take 20: each costs ONNX Runtime's per-node time, whatever its size
            dh = d if self.h_name is None else \
                self.emit("Floor", [self.emit("Mul", [d, self.of_h("4_h", 4.0 ** -k)], "d_4h")], "dh")
            return _inverse_root(self.b, dh, f"{self.pre}::r")
        if self.float64_d:
            d = self.emit("Cast", [d], "d", to=TensorProto.INT64)
        dh = d if self.h_name is None else self.emit("Div", [d, self.of_h("4h", 4 ** k)], "dh")
        a = self.emit("Div", [_int64(self.b, f"{self.pre}::np", 1 << layernorm_rule.NUMERATOR_BITS), dh], "a")
        r = _isqrt(self.b, a, f"{self.pre}::r")
        return self.emit("Cast", [r], "r64", to=TensorProto.DOUBLE) if self.float64_u else r

    def u(self, r: str) -> str:
        """u = floor(c r / 2^(h + down)): float64 where :attr:`float64_u`, else int64."""
        shifts = np.arange(len(self.limits) + 1) + self.down
        if not self.float64_u:
            c = self.c if self.exact is None else self.emit("Cast", [self.c], "c_i", to=TensorProto.INT64)
            shift = self.of_h("h_down", shifts) if self.h_name is not None else np.int64(self.down)
            return _floor_div(self.b, self.emit("Mul", [c, r], "cr"), shift, f"{self.pre}::u", bound=self.c_max << 30)
        rs = self.emit("Mul", [r, self.of_h("2_hd", 2.0 ** -shifts)], "rs")
        if self.rows:
            crs = self.emit("Sub", [self.emit("Mul", [self.x64, self.emit("Mul", [rs, self.n64], "nrs")], "xnrs"),
                                    self.emit("Mul", [self.total, rs], "srs")], "crs")
        else:
            crs = self.emit("Mul", [_as_double(self.b, self.c, self.c_type, f"{self.pre}::c64"), rs], "crs")
        return self.emit("Floor", [crs], "uf")

    def output(self, u: str) -> str:
        """y = floor((u G + B + 2^(t-1)) / 2^t), clamped, into the node's output."""
        t, g, bias = self.t, self.g, self.bias
        # |u| <= |c| r / 2^down, r <= 2^30 (D_h >= 1), and (the rule's own bound) c^2 <= N D
        bound = layernorm_rule.output_bound(min((self.c_max << 30) >> self.down, layernorm_rule.u_max(self.n)),
                                            g, bias, t)
        if self.float64_u and bound < FLOAT64_INTEGERS:
            # floor(u G / 2^t + (B + 2^(t-1)) / 2^t): u G and B are integers below 2^53, so each term is exact in
            # float64 (a power of two apart from them), and so are their sum (a multiple of 2^-t) and its Floor
            ts = 2.0 ** -t
            ug = self.emit("Mul", [u, self.const("g_2t", g.astype(np.float64) * ts)], "ug")
            y64 = self.emit("Add", [ug, self.const("b_2t", (bias.astype(np.float64) + 2.0 ** (t - 1)) * ts)], "y64")
            if t <= 45:  # a multiple of 2^-t below 256 is a float64: codes by a Cast (QOperatorBuilder.finish)
                self.b.exact_sums.add(y64)
            y = self.emit("Floor", [y64], "q64")
            _store(self.b, self.node, self.emit("Cast", [y], "q", to=TensorProto.FLOAT), in_float32=True)
            return "float64 normalization"
        if self.float64_u:
            u = self.emit("Cast", [u], "u", to=TensorProto.INT64)
        offset = OFFSET if bound < OFFSET else 0  # the division's offset, added with the bias and the rounding's half
        biased = self.emit("Add", [self.emit("Mul", [u, self.const("g", g)], "crg"),
                                   self.const("b", bias + ((1 << (t - 1)) + offset))], "rounded")
        _store(self.b, self.node, _floor_div(self.b, biased, t, f"{self.pre}::q64", bound=bound,
                                             offset_added=bool(offset), float32_out=True), in_float32=True)
        return "int64 normalization"


def _as_double(builder, x: str, dtype, out: str) -> str:
    """``x`` (of the float ``dtype``) in float64, cast once whoever asks."""
    if dtype == TensorProto.DOUBLE:
        return x
    if out not in builder._made:
        builder._made.add(out)
        builder.emit("Cast", [x], out, to=TensorProto.DOUBLE)
    return out


def _float(builder, name: str, value, dtype) -> str:
    """A scalar constant in ``dtype`` (FLOAT, DOUBLE or None: int64)."""
    kind = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, None: np.int64}[dtype]
    return builder.const(f"{name}_{np.dtype(kind).name}", kind(value))


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def requantize(builder, acc64: str, multiplier, shift, single: bool, shape, pre: str) -> str:
    """The fixed-point requantization of int64 accumulators ``acc64`` (channels on the axis
    ``shape`` puts -1 on), as :func:`~npuforge.sim.int_ops.requantize_fixedpoint` (``single``:
    :func:`~npuforge.sim.int_ops.requantize_single`) computes it, in the same int64 steps;
    ``multiplier`` and ``shift`` are int64 arrays [C] -> int64 codes less the zero point,
    before the clamp."""
    multiplier, shift = np.asarray(multiplier, np.int64), np.asarray(shift, np.int64)
    k = lambda tag, arr: builder.const(f"{pre}::{tag}", np.asarray(arr, np.int64).reshape(shape))  # noqa: E731
    lo, hi = _int64(builder, "int32_min64", INT32_MIN), _int64(builder, "int32_max64", INT32_MAX)
    x = builder.emit("Clip", [acc64, lo, hi], f"{pre}::sat")
    if single:
        total = 31 - shift
        t = builder.emit("Mul", [x, k("m", multiplier)], f"{pre}::t")
        return _floor_div(builder, builder.emit("Add", [t, k("half", 1 << (total - 1))], f"{pre}::rounded"),
                          total.reshape(shape), f"{pre}::q64",
                          bound=(1 << 31) * int(np.abs(multiplier).max()) + (1 << int(total.max() - 1)))
    if (shift > 0).any():
        x = builder.emit("Clip", [builder.emit("Mul", [x, k("up", 1 << np.maximum(shift, 0))], f"{pre}::x_up"), lo, hi],
                         f"{pre}::sat_up")
    e = np.maximum(-shift, 0)
    pos = (e > 0).astype(np.int64)
    t = builder.emit("Mul", [x, k("m", multiplier)], f"{pre}::t")
    total = builder.emit("Add", [t, k("c", (1 << 30) + pos * (1 << (30 + e)))], f"{pre}::tc")
    if pos.any():  # RoundingDivideByPOT rounds half away from zero: one less below -2^30
        below = builder.emit("Cast", [builder.emit("Less", [t, _int64(builder, "minus_2_30", -(1 << 30))],
                                                   f"{pre}::neg")], f"{pre}::neg64", to=TensorProto.INT64)
        total = builder.emit("Sub", [total, builder.emit("Mul", [below, k("pos31", pos << 31)], f"{pre}::negc")],
                             f"{pre}::tcn")
    # |x| <= 2^31 after the clip: |x M| <= 2^31 max M, then the rounding constants
    bound = (1 << 31) * int(np.abs(multiplier).max()) + (1 << 31) + (1 << (30 + int(e.max())))
    return _floor_div(builder, total, (31 + e).reshape(shape), f"{pre}::q64", bound=bound)


def elementwise(builder, node) -> str:
    """Add / Sub / Mul in the fixed-point modes, as the plain simulator's ``_elementwise``
    computes them: npuforge's two-multiplier Add by a table per operand (:func:`_add_by_tables`);
    TFLite's three-multiplier ADD and Mul's one requantization of the product on int64 copies of
    ``q - zp``."""
    plain, pre = builder.plain, node.name
    if plain.rounding == "onnx":
        builder.refuse(node, "ONNX Runtime's QLinearAdd / QLinearMul arithmetic is float, with no int64 form")
    if node.op not in ("Add", "Sub", "Mul"):
        builder.refuse(node, f"no integer rule for elementwise {node.op}")
    qs = [builder.activation(node, name) if f"input{k}" not in node.quant else plain._q(name)
          for k, name in enumerate(node.inputs[:2])]
    builder.activation(node, node.outputs[0])
    if node.op != "Mul" and "multiplierout" not in node.quant:
        return _add_by_tables(builder, node)
    xs = []
    for k, name in enumerate(node.inputs[:2]):
        if f"input{k}" in node.quant:  # a constant operand: its codes
            xs.append(_int64(builder, f"{pre}::c{k}", plain._int(node, f"input{k}").astype(np.int64)
                             - int(qs[k].zero_point)))
        else:
            xs.append(builder.emit("Cast", [name], f"{pre}::x{k}", to=TensorProto.INT64))
    single = plain.rounding == "single"
    one = [1]

    def rescale(x: str, m: str, s: str, tag: str) -> str:
        return requantize(builder, x, [int(plain._int(node, m)[0])], [int(plain._int(node, s)[0])], single, one,
                          f"{pre}::{tag}")

    if node.op == "Mul":
        y = rescale(builder.emit("Mul", xs, f"{pre}::prod"), "multiplier", "shift", "rq")
        _store(builder, node, y)
        return "int64 fixed-point Mul"
    # TFLite's ADD / SUB: each operand shifted up and rescaled, the sum requantized
    up = _int64(builder, f"{pre}::2bits", 1 << int(plain._int(node, "left_shift")))
    ts = [rescale(builder.emit("Mul", [x, up], f"{pre}::x{k}_up"), f"multiplier{k}", f"shift{k}", f"rq{k}")
          for k, x in enumerate(xs)]
    total = builder.emit("Add" if node.op == "Add" else "Sub", ts, f"{pre}::total")
    _store(builder, node, rescale(total, "multiplierout", "shiftout", "rq_out"))
    return f"int64 fixed-point {node.op}"


TABLE_CODES = 256  # an operand with more codes is rescaled by arithmetic, not a 512 KB table per int16
# operand (under ONNX Runtime's profiler such a lookup took 107 us where a uint8 table took 15; alone and
# unprofiled, deit_tiny's int16 Add took 65 us either way)


def _add_by_tables(builder, node) -> str:
    """npuforge's two-multiplier Add / Sub with an operand too wide for a table of every pair of
    codes: each operand's rescaling ``t_k = R((q_k - zp_k) 2^bits)`` depends on that operand alone,
    so it is a table over the operand's codes (a constant operand: its own values), computed by
    the plain simulator's requantization; an int16 operand's is computed (:func:`_rescaled`).
    Their sum z (|t_k| < 2^33: exact in float64) is divided by 2^bits, and RoundingDivideByPOT's
    rounding half away from zero is the truncating Cast of ``z + sign(z) / 2``. Where every
    operand is a table, the tables hold ``t_k / 2^bits`` already, rolled so that
    ``GatherElements`` reads them at ``q - zp`` itself (negative indices count from the end).
    17 ONNX nodes where the int64 form took 36 (deit_tiny)."""
    plain, pre = builder.plain, node.name
    qs = [plain._q(name) for name in node.inputs[:2]]
    shifts = [int(plain._int(node, f"shift{k}")[0]) for k in range(2)]
    multipliers = [int(plain._int(node, f"multiplier{k}")[0]) for k in range(2)]
    bits = min(extra_bits(max_abs_code(qs[k]), shifts[k]) for k in range(2))
    computed = [f"input{k}" not in node.quant and qs[k].qmax - qs[k].qmin >= TABLE_CODES for k in range(2)]
    scale = 1.0 if any(computed) else 2.0**-bits  # one Mul after the sum where a term is computed
    terms = []
    for k, name in enumerate(node.inputs[:2]):
        sign = -1.0 if k == 1 and node.op == "Sub" else 1.0

        def rescaled(x: torch.Tensor, k=k, factor=sign * scale) -> np.ndarray:
            t = plain._R(x << bits, multipliers[k], shifts[k])
            return t.numpy().astype(np.float64) * factor

        if computed[k]:
            t = _rescaled(builder, name, multipliers[k], shifts[k], bits, plain.rounding == "single", f"{pre}::t{k}")
            terms.append(t if sign > 0 else builder.emit("Neg", [t], f"{pre}::t{k}_neg"))
        elif f"input{k}" in node.quant:  # a constant operand: its terms, broadcast by the Add
            codes = torch.from_numpy(plain._int(node, f"input{k}").astype(np.int64) - int(qs[k].zero_point))
            terms.append(builder.const(f"{pre}::t{k}", rescaled(codes)))
        else:
            low = qs[k].qmin - int(qs[k].zero_point)
            table = np.roll(rescaled(torch.arange(low, qs[k].qmax - int(qs[k].zero_point) + 1)), low)
            index = builder.emit("Cast", [name], f"{pre}::ix{k}", to=TensorProto.INT32)
            terms.append(builder.lookup(builder.const(f"{pre}::table{k}", table), index, f"{pre}::t{k}",
                                        like=name))
    z = builder.emit("Add", terms, f"{pre}::z")
    if scale == 1.0 and bits:
        z = builder.emit("Mul", [z, builder.const(f"{pre}::2_bits", np.float64(2.0**-bits))], f"{pre}::zs")
    _store(builder, node, _round_half_away(builder, z, f"{pre}::q32") if bits else z)
    return f"{node.op} by a table per operand (float64)" if scale != 1.0 else \
        f"{node.op} with its int16 operands rescaled in float64"


def _rescaled(builder, x: str, multiplier: int, shift: int, bits: int, single: bool, out: str) -> str:
    """``R((q - zp) 2^bits)`` in float64 for the float32 ``x`` = q - zp of an operand of up to 16
    bits (``bits`` keeps ``|x| 2^(bits + max(shift, 0))`` below 2^30: nothing saturates). Both
    roundings first take ``floor(v + 1/2)`` of ``v = x M 2^(bits + shift - 31)`` (the single one
    alone; the fixed-point one's SaturatingRoundingDoublingHighMul, at 2^(31 + e) times this scale).
    The fixed-point one then divides by 2^e, e = -shift > 0, rounding half away from zero:
    ``floor((floor(v 2^e + 1/2) + 2^(e-1) - [q < 0]) / 2^e)``, one floor of
    ``v + 1/2 + sign(q) / 2^(e+1)`` (an inner floor inside a division by a power of two is the
    outer floor's; where q < 0 and v >= -1/2 both give 0). |x M| < 2^46, so every sum is an
    integer times 2^(bits + shift - 31) below 2^53: exact."""
    assert abs(multiplier) < 1 << 31 and bits + max(shift, 0) <= 30
    x64 = builder.emit("Cast", [x], f"{out}::x64", to=TensorProto.DOUBLE)
    v = builder.emit("Mul", [x64, builder.const(f"{out}::m", np.float64(multiplier * 2.0 ** (bits + shift - 31)))],
                     f"{out}::v")
    if not single and shift < 0:
        # sign(q) / 2^(e+1): q / 2^(e+1) clipped to +-1 / 2^(e+1) (q an integer)
        d = np.float64(2.0 ** (shift - 1))
        signed = builder.emit("Clip", [builder.emit("Mul", [x64, builder.const(f"{out}::d", d)], f"{out}::xd"),
                                       builder.const(f"{out}::-d", -d), builder.const(f"{out}::+d", d)], f"{out}::sd")
        v = builder.emit("Add", [v, signed], f"{out}::vs")
    half = builder.emit("Add", [v, builder.const("float64_half", np.float64(0.5))], f"{out}::vh")
    return builder.emit("Floor", [half], out)


def interpolate(builder, node) -> str:
    """npuforge/quant/resize_rule.py's bilinear Resize as two float64 matrix products, the rows
    and then the columns, each by a constant [out, in] matrix holding every output's two 10-bit
    weights (the rule's four-term sum, regrouped, is the same integer). Every product and partial
    sum is an integer times 2^-20 below 2^39, exact in float64 whatever the order of the sums, so
    the columns' matrix carries the final 2^-20 too; ``z + sign(z) / 2`` is exact and its Cast to
    int32 truncates: the rule's rounding half away from zero. (Gathers of the neighbours on the
    last axis, in int64, took 2.9 of 6.1 ms on [1, 21, 160, 160].)"""
    from ..quant.resize_rule import axis_weights

    plain, pre, x = builder.plain, node.name, node.inputs[0]
    xq = builder.activation(node, x)
    yq = builder.activation(node, node.outputs[0])
    shift = 128 if yq.dtype == "uint8" else 0  # the rule reads uint8 codes as int8
    v = builder.emit("Add", [x, builder.const(f"{pre}::zp_shift", np.float32(int(xq.zero_point) - shift))],
                     f"{pre}::v32")  # x is q - zp_x in float32: exact
    v = builder.emit("Cast", [v], f"{pre}::v", to=TensorProto.DOUBLE)
    shape_in, shape_out = builder.graph.values[x].shape, builder.graph.values[node.outputs[0]].shape
    align, half = bool(plain._int(node, "align_corners")), bool(plain._int(node, "half_pixel_centers"))
    matrices = []
    for axis in (2, 3):
        lo, hi, w0, w1 = axis_weights(shape_in[axis], shape_out[axis], align, half)
        m = np.zeros((shape_out[axis], shape_in[axis]))
        rows = np.arange(shape_out[axis])
        np.add.at(m, (rows, lo), w0)
        np.add.at(m, (rows, hi), w1)
        matrices.append(m)
    rows = builder.emit("MatMul", [builder.const(f"{pre}::rows", matrices[0]), v], f"{pre}::by_rows")
    z = builder.emit("MatMul", [rows, builder.const(f"{pre}::cols", matrices[1].T * 2.0**-20)], f"{pre}::z")
    y = _round_half_away(builder, z, f"{pre}::y")
    _store(builder, node, builder.emit("Add", [y, builder.const(f"{pre}::to_c", np.int32(shift - int(yq.zero_point)))],
                                       f"{pre}::q64"))
    return "float64 bilinear (two exact matrix products)"


def _round_half_away(builder, z: str, out: str) -> str:
    """int32 round-half-away-from-zero of float64 ``z`` (an integer times 2^-k, below 2^31, so
    ``z + sign(z) / 2`` is exact): its Cast truncates toward zero."""
    half = builder.emit("Mul", [builder.emit("Sign", [z], f"{out}::sign"), builder.const("float64_half", 0.5)],
                        f"{out}::half")
    return builder.emit("Cast", [builder.emit("Add", [z, half], f"{out}::rounded")], out, to=TensorProto.INT32)


OFFSET = 1 << 62  # a multiple of every power of two divided by here


def _floor_div(builder, x: str, exponent, out: str, bound: int | None = None, offset_added: bool = False,
               float32_out: bool = False) -> str:
    """floor(x / 2^k) for signed int64 x, ``exponent`` k (at most 62) an int array (constant,
    broadcast against x) or the name of an int64 tensor. ONNX's integer Div truncates. Where
    |x| <= ``bound`` < 2^62, x + 2^62 is positive and within int64: it is shifted right as
    uint64 (BitShift) and 2^(62 - k) taken off (in ONNX Runtime 113 us on [1, 40, 40, 64],
    dividing it instead 298 us); any other x takes the remainder (Mod with the divisor's sign)
    first, then divides (310 us on [1, 197, 192], where adding the offset and dividing took 104).
    ``offset_added``: ``x`` is already ``x + 2^62`` (the caller folded it into a constant it adds).
    ``float32_out``: the result in float32 (its codes' range); where the shifted ``floor(x / 2^k) +
    2^(62 - k)`` stays below 2^24 it is cast from uint64 and the offset taken off in float32, one
    int64 pass fewer."""
    computed = isinstance(exponent, str)
    if computed:
        k = builder.emit("Cast", [exponent], f"{out}::k", to=TensorProto.UINT64)
    else:
        exponent = np.asarray(exponent, np.int64)
    assert bound is not None and bound < OFFSET or not offset_added
    if bound is not None and bound < OFFSET:
        if not computed:
            k = builder.const(f"{out}::k", exponent.astype(np.uint64))
        shifted_up = x if offset_added else \
            builder.emit("Add", [x, _int64(builder, "int64_2_62", OFFSET)], f"{out}::off")
        unsigned = builder.emit("Cast", [shifted_up], f"{out}::off_u", to=TensorProto.UINT64)
        shifted_u = builder.emit("BitShift", [unsigned, k], f"{out}::off_s", direction="RIGHT")
        if float32_out and not computed and \
                (bound >> int(exponent.min())) + 1 + (OFFSET >> int(exponent.min())) < FLOAT32_INTEGERS:
            shifted = builder.emit("Cast", [shifted_u], f"{out}::off_f", to=TensorProto.FLOAT)
            taken = builder.const(f"{out}::offd_f", (OFFSET >> exponent).astype(np.float32))
            return builder.emit("Sub", [shifted, taken], out)
        shifted = builder.emit("Cast", [shifted_u], f"{out}::off_q", to=TensorProto.INT64)
        if computed:
            taken = builder.emit("Cast", [builder.emit("BitShift", [builder.const("uint64_2_62", np.uint64(OFFSET)), k],
                                                       f"{out}::offd_u", direction="RIGHT")],
                                 f"{out}::offd", to=TensorProto.INT64)
        else:
            taken = _int64(builder, f"{out}::offd", OFFSET >> exponent)
        return _as_float32(builder, builder.emit("Sub", [shifted, taken], f"{out}::i" if float32_out else out), out,
                           float32_out)
    if computed:
        power = builder.emit("Cast", [builder.emit("BitShift", [builder.const("uint64_one", np.uint64(1)), k],
                                                   f"{out}::pow_u", direction="LEFT")], f"{out}::pow", to=TensorProto.INT64)
    else:
        power = _int64(builder, f"{out}::pow", np.left_shift(np.int64(1), exponent))
    exact = builder.emit("Sub", [x, builder.emit("Mod", [x, power], f"{out}::rem", fmod=0)], f"{out}::exact")
    return _as_float32(builder, builder.emit("Div", [exact, power], f"{out}::i" if float32_out else out), out,
                       float32_out)


def _as_float32(builder, x64: str, out: str, cast: bool) -> str:
    return builder.emit("Cast", [x64], out, to=TensorProto.FLOAT) if cast else x64


def _inverse_root(builder, dh: str, out: str) -> str:
    """r = isqrt(2^60 // D_h) for float64 integers 1 <= D_h < 2^23, as floor(2^30 / sqrt(D_h))
    (floor(sqrt(floor(y))) = floor(sqrt(y))): the correctly rounded Sqrt and Div land on the
    same side of every integer, checked for each D_h (tests/test_sim_lowered.py)."""
    assert layernorm_rule.NUMERATOR_BITS == 60
    root = builder.const("float64_2_30", np.float64(2.0**30))
    return builder.emit("Floor", [builder.emit("Div", [root, builder.emit("Sqrt", [dh], f"{out}::sqrt")],
                                               f"{out}::est")], out)


ISQRT_BELOW = 2.0**-20  # above the float64 estimate's error on r < 2^31 (3 2^-23) plus the Sub's rounding (2^-22)


def _isqrt(builder, a: str, out: str) -> str:
    """floor(sqrt(a)) of int64 a below 2^62: the float64 estimate less 2^-20, truncated, is r or
    r - 1 (never above r, never below r - 1), so one correction upward makes it exact."""
    est = builder.emit("Sqrt", [builder.emit("Cast", [a], f"{out}::a64", to=TensorProto.DOUBLE)], f"{out}::sqrt")
    below = builder.emit("Sub", [est, builder.const("float64_isqrt_below", np.float64(ISQRT_BELOW))], f"{out}::below")
    r0 = builder.emit("Cast", [below], f"{out}::r0", to=TensorProto.INT64)  # truncates: 0 for a = 0
    up = builder.emit("Add", [r0, _int64(builder, "int64_one", 1)], f"{out}::r0p")
    fits = builder.emit("LessOrEqual", [builder.emit("Mul", [up, up], f"{out}::r0psq"), a], f"{out}::fits")
    return builder.emit("Where", [fits, up, r0], out)
