"""The fast path of the integer simulator: the quantized IR as ONNX Runtime's own
integer operators (QOperator form), on uint8 codes.

* Conv / Gemm: ``QLinearConv`` (a Gemm as a 1x1 one on ``[N, K, 1, 1]``). On an x86
  CPU with VNNI its int8 weights go in as they are: ONNX Runtime's u8s8 kernels sum
  u8 x s8 products in int32 there, exactly, and run 1.6-1.9x faster than u8u8
  (docs/benchmarks.md). Elsewhere they are stored as uint8 ``w + 128``, zero point
  128: the accumulator is unchanged, ``sum (x - zp_x) (w + 128 - 128)``, and the u8u8
  kernels compute it exactly, where u8s8 kernels without VNNI add pairs of
  products in saturating int16 and would not (docs/simulator.md). It then
  outputs ``rint(float32(acc) * s)`` in float32, ``s = x_scale * w_scale / y_scale``;
  with unit x and y scales, ``s`` is the per-channel w_scale given. That is the
  ``onnx`` rounding by definition; for ``fixedpoint`` and ``single`` a float32 ``s``
  near each channel's multiplier is searched for and kept only where
  :func:`~npuforge.sim.monotone_fit.fit` proves the rule equal to the mode's on the
  channel's whole accumulator range (the quantizer picks multipliers for which
  one exists: :mod:`npuforge.quant.ort_multipliers`). A fused Relu / Clip
  narrower than the type is a ``Clip`` on the codes.
* Mul by a uint8 constant with one value per channel (a batch norm after a Concat, a layer
  scale) or one value, fixed-point: a depthwise 1x1 ``QLinearConv`` with the constant's codes as weights,
  each channel's scale proven on its product range.
* Add of two same-shaped activations, in every rounding mode: com.microsoft
  ``QLinearAdd``, with ratios proven equal to the Add's table of all 65,536 results
  (:mod:`npuforge.sim.qlinear_add`). Mul (``onnx``): ``QLinearMul``;
  GlobalAveragePool: ``QLinearGlobalAveragePool`` (``onnx``; the others with a scale proven on every sum).
* lookup ops: a lookup (``GatherElements``) in the plain simulator's table.
* ops that move codes: the op itself, on uint8 (a Pad filling with its value's code; a 2-D
  MaxPool as ONNX Runtime's channels-last NhwcMaxPool, which its channels-first uint8 one is not).

A Conv's channels that no float32 scale reproduces run apart: ``MatMulInteger`` on the
channels-last input for a 1x1 convolution (ONNX Runtime runs QLinearConv channels-last, so
no layout transposes), ``ConvInteger`` otherwise, then a proven float formula, merged back in
channel order. Any other node (a windowed pooling, a broadcast Add, Sub, a node with an
int16 operand...) is lowered by the float lowering
(:mod:`npuforge.sim.lowered`) between conversions of its activations from codes
to float ``q - zp`` and back, so one session runs the whole graph; what it
cannot lower raises :class:`~npuforge.errors.UnsupportedError`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from fractions import Fraction

import numpy as np
import torch
from onnx import TensorProto, numpy_helper

from ..export.onnx_export import _nodes_of
from ..ir import dtypes
from ..ops.activation import FUSED_ATTRS
from ..quant.requant import multiplier_value
from . import qlinear_add
from .lowered import _Builder, channel_subset, matmul_rule, requant_rule, uint8_weights
from .int_ops import NP_INT, value_code
from .lowering_base import LoweringBuilder, channel_ranges, matmul_ranges, pointwise_conv, runs_in_float
from .monotone_fit import Formula, fit_channels, float32_nudged, verify

SCATTER_FRACTION = 16  # at most one channel in 16 apart: merged by a scatter (see _merge)
SMALL_OUTPUT = 1024  # outputs per sample up to this, with channels apart: all on the integer kernel, no merge
SCALE_NUDGES = tuple(sorted(range(-3, 4), key=abs))  # ulps from float32(multiplier) tried per channel
EXPANDED_BYTES = 1 << 18  # a constant Add operand stored at one sample's shape up to this size, else expanded
POOL_NUDGES = tuple(sorted(range(-64, 65), key=abs))  # one scale per pool: more of them tried

MOVERS = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "MaxPool", "Slice", "Split",
          "Gather", "Concat", "Pad"}


def signed_weights_exact() -> bool:
    """Whether ONNX Runtime's u8s8 integer convolutions are exact on this CPU (and faster than its
    u8u8 ones): on x86 with VNNI, whose instructions sum u8 x s8 products in int32, not on x86 without
    it (pairs summed in saturating int16), nor, unmeasured, elsewhere. ``NPUFORGE_U8U8=1`` forces
    the u8u8 kernels (to compare the two)."""
    import os

    return os.environ.get("NPUFORGE_U8U8", "") != "1" and _x86_with_vnni()


@functools.lru_cache(maxsize=1)
def _x86_with_vnni() -> bool:
    import platform

    from ..workflow import cpu_lacks_vnni

    return platform.machine().lower() in ("x86_64", "amd64") and not cpu_lacks_vnni()


_PROVEN: dict = {}  # _proof_key -> what QOperatorBuilder._scales proved


def _proof_key(plain, node, prep: dict, *ranges) -> str:
    """A digest of everything the proof of a node's QLinearConv scales reads: the rounding
    rule (mode, function, int32 saturation, multipliers / scales), the bias, the output's
    zero point and the channels' accumulator and output ranges."""
    import hashlib

    rule = prep.get("R")
    h = hashlib.sha256(repr((plain.rounding, getattr(rule, "__module__", None), getattr(rule, "__qualname__", None),
                             prep.get("fits_int32"), int(plain._q(node.outputs[0]).zero_point))).encode())
    for k in ("M", "S", "Mneg", "Sneg", "scale", "scale_neg", "bias"):
        v = prep.get(k)
        v = None if v is None else np.ascontiguousarray(np.asarray(v))
        h.update(repr((k, None if v is None else (v.dtype.str, v.shape))).encode())
        if v is not None:
            h.update(v.tobytes())
    for arr in ranges:
        h.update(np.ascontiguousarray(arr, np.int64).tobytes())
    return h.hexdigest()


class QOperatorBuilder(LoweringBuilder):
    ELEM_TYPE, SUFFIX, DOMAINS = TensorProto.UINT8, "qoperator", ("com.microsoft",)

    def codes(self, node, name: str):
        """The parameters of ``name``, a uint8 per-tensor activation (or a refusal)."""
        v = self.graph.values[name]
        p = v.quant
        if v.is_const or p is None or p.dtype != "uint8" or p.per_channel:
            self.refuse(node, f"'{name}' is not a uint8 per-tensor activation")
        return p

    def zero_point(self, node, name: str) -> str:
        return self.const(f"{name}::zp", np.uint8(self.codes(node, name).zero_point))

    def qparams(self, node, name: str) -> list[str]:
        """[scale, zero point] initializers of a uint8 per-tensor activation (or a refusal)."""
        return [self.const(f"{name}::scale", np.float32(self.codes(node, name).scale)), self.zero_point(node, name)]

    def __init__(self, plain, float_nodes: bool = False):
        super().__init__(plain, float_nodes)
        self._float = None  # the float lowering, for the nodes with no QLinear form
        self._float_names: dict[str, str] = {}  # activation -> its float "q - zp" copy

    def elem_type(self, name: str) -> int:
        """Codes in their own type: uint8, or an int16 output of a mixed-precision program."""
        v = self.graph.values[name]
        return dtypes.to_onnx(v.quant.dtype if v.quant is not None else v.dtype)

    def check_inputs(self) -> None:
        for name in self.graph.inputs:
            v = self.graph.values[name]
            # a float input feeds nodes kept in float; token ids and the like are read as they are
            if v.quant is not None or (v.dtype != "float32" and not self.is_index(name)):
                self.codes(None, name)

    def finish(self) -> None:
        """Bypass a node whose only reader makes it redundant (the dead node then goes with the others):
        a Clip to [-zp, 255 - zp] read by ``QuantizeLinear(v, 1, zp)`` into uint8, that clamp being the
        quantizer's own saturation (``rint`` commutes with a clamp to integer bounds); a Reshape, Flatten,
        Squeeze or Unsqueeze read by a Reshape to a constant shape with no 0 (a copied axis), which depends
        only on the elements, in the same order (kws_dscnn1d's Flatten before its classifier's rows). Copies
        are read through (:func:`_copied`)."""
        values = {t.name: numpy_helper.to_array(t) for t in self.inits}
        made_by = {o: n for n in self.nodes for o in n.output}
        kept = set(self.graph.outputs)

        def scalar(name: str, dtype) -> float | None:
            v = values.get(name)
            return float(v) if v is not None and v.size == 1 and v.dtype == dtype else None

        def redundant(n, p) -> bool:
            if n.op_type == "QuantizeLinear" and p.op_type == "Clip" and len(n.input) == 3 and len(p.input) == 3:
                zp = scalar(n.input[2], np.uint8)
                return scalar(n.input[1], np.float32) == 1 and zp is not None and \
                    tuple(scalar(name, np.float32) for name in p.input[1:]) == (-zp, 255 - zp)
            if n.op_type == "Reshape" and p.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
                shape = values.get(n.input[1])
                return shape is not None and not (shape == 0).any()
            return False

        for n in self.nodes:  # a copy (an Identity, a Concat of one input: GPT-2's past keys) read through
            n.input[:] = [_copied(name, made_by, kept) for name in n.input]
        readers = Counter(name for n in self.nodes for name in n.input)
        for n in self.nodes:  # (a bypassed node's only reader was n: its input's readers stay as counted)
            while (p := made_by.get(n.input[0]) if n.input else None) is not None and readers[p.output[0]] == 1 \
                    and p.output[0] not in kept and redundant(n, p):
                n.input[0] = p.input[0]
        self.nodes[:] = [n for n in self.nodes if not self._codes_by_cast(n, made_by, readers, values)]

    def _codes_by_cast(self, n, made_by: dict, readers: Counter, values: dict) -> bool:
        """``QuantizeLinear(Cast(Floor(w)), 1, zp)`` as ``Cast(Clip(w + zp, 0, 255), uint8)``: the clamp and
        floor commute (integer bounds), and the Cast to uint8 truncates, which on [0, 255] is the floor.
        ``w`` is float64 (a Cast to float32 follows its Floor). With zp 0 that holds for any ``w`` (a
        softmax's quotient). Else ``w = v + K`` must be an exact sum of multiples of 2^-t, t <= 45 (a
        normalization's output; :attr:`exact_sums`), and ``K + zp`` exact, which then becomes the Add's
        constant: ``w + zp`` is exact wherever it lies in [0, 256) (a multiple of 2^-45 below 2^8), and
        rounded past 0 or 256 no further than to them elsewhere. Floor, Cast and QuantizeLinear took three
        passes -> whether ``n`` went (its Cast took over)."""
        def single(name: str, op: str):
            p = made_by.get(name)
            return p if p is not None and p.op_type == op and readers[name] == 1 else None

        if n.op_type != "QuantizeLinear" or len(n.input) != 3 or values.get(n.input[1]) != 1 or \
                values.get(n.input[2]) is None or values[n.input[2]].dtype != np.uint8:
            return False
        cast = single(n.input[0], "Cast")
        floor = cast and cast.attribute[0].i == TensorProto.FLOAT and single(cast.input[0], "Floor")
        if not floor:
            return False
        zp = int(values[n.input[2]])
        if zp:
            total = single(floor.input[0], "Add")
            if not total or total.output[0] not in self.exact_sums or total.input[1] not in values:
                return False
            k = values[total.input[1]]
            shifted = k + np.float64(zp)
            if k.dtype != np.float64 or any(Fraction(float(a)) != Fraction(float(b)) + zp
                                            for a, b in zip(shifted.flat, k.flat)):
                return False
            total.input[1] = self.const(f"{total.input[1]}+{zp}", shifted)
        floor.op_type = "Clip"
        floor.input[:] = [floor.input[0], self.const("float64_0", np.float64(0)),
                          self.const("float64_255", np.float64(255))]
        cast.attribute[0].i = TensorProto.UINT8
        cast.output[0] = cast.name = n.output[0]
        return True

    # -- nodes lowered in float ------------------------------------------------------------
    def _float_builder(self):
        """The float lowering, emitting into this graph."""
        if self._float is None:
            self._float = _Builder(self.plain)
            self._float.nodes, self._float.inits, self._float._consts = self.nodes, self.inits, self._consts
            self._float._made, self._float.exact_int, self._float.exact_sums = self._made, self.exact_int, \
                self.exact_sums
        return self._float

    def _uint8(self, name: str) -> bool:
        p = self.graph.values[name].quant
        return p is not None and p.dtype == "uint8" and not p.per_channel

    def lower(self, node, handler) -> None:
        """A node reading or writing a quantized activation that is not uint8 per-tensor (an int16
        layer of a mixed-precision program) has no QLinear form: it runs in the float lowering,
        its wide values held only as float copies."""
        g = self.graph
        if any(n and g.values[n].quant is not None and not g.values[n].is_const and not self._uint8(n)
               for n in (*node.inputs, *node.outputs)):
            return self._in_float(node, "an operand that is not uint8")
        handler(node)

    def _in_float(self, node, why: str):
        """Lower ``node`` with the float lowering on float copies of its activations."""
        self._float_builder()
        g = self.graph
        # float values (no parameters: computed in float) are read as they are
        renames = {n: self._as_float(node, n) for n in node.inputs
                   if n and not g.values[n].is_const and g.values[n].quant is not None}
        start = len(self.nodes)
        kind = self.plain._kind(node)
        getattr(self._float, "_float_node" if runs_in_float(g, node, kind) else f"_{kind}")(node)
        quantized = [y for y in node.outputs if y and g.values[y].quant is not None]
        renames.update({y: f"{y}::f" for y in quantized})
        for emitted in self.nodes[start:]:
            for field in (emitted.input, emitted.output):
                names = [renames.get(n, n) for n in field]
                del field[:]
                field.extend(names)
            emitted.name = emitted.output[0]  # nodes are named after their output
        for y in quantized:
            self._float_names[y] = f"{y}::f"  # later nodes in float read it as it is
            if not self._uint8(y):  # an int16 value lives only as its float copy, or its codes if an output
                if y in g.outputs:
                    shifted = self.emit("Add", [f"{y}::f", self.const(f"{y}::zp_f", self._zero_point(y))],
                                        f"{y}::fq")
                    self.emit("Cast", [shifted], y, to=self.elem_type(y))
                continue
            # the clamped integers q - zp back to codes: rint(v / 1) + zp, one pass where Add and Cast took two
            self.emit("QuantizeLinear", [f"{y}::f", self.const("unit_scale", np.float32(1)), self.zero_point(node, y)],
                      y)
        self.report[node.name] = f"in float ({why}): {self._float.report.get(node.name, '')}"

    def _float_node(self, node):
        """A node kept in float between ONNX Runtime's ``DequantizeLinear`` of its uint8 inputs
        (``float32(q - zp) * s``, the float lowering's numbers) and ``QuantizeLinear`` of its
        uint8 outputs (``rint(y / s) + zp`` saturated to [0, 255], MLAS dividing in float32:
        the quantizer's rounding, clamped to [qmin, qmax] after): one pass over each instead
        of the float lowering's five elementwise ops on the output and three on each input."""
        g = self.graph
        renames = {}
        for name in node.inputs:
            v = g.values[name] if name else None
            if v is not None and v.is_const:
                self.const(name, np.asarray(v.data))
            elif v is not None and v.quant is not None:
                renames[name] = f"{name}::deq"
                if renames[name] not in self._made:  # once per value, whoever else reads it in float
                    self._made.add(renames[name])
                    self.emit("DequantizeLinear", [name, *self.qparams(node, name)], renames[name])
        quantized = [y for y in node.outputs if y and g.values[y].quant is not None]
        self.float_op(node, renames, quantized)
        for y in quantized:
            self._saturated(node, y, "QuantizeLinear", [f"{y}::float", *self.qparams(node, y)])
        self.report[node.name] = "in float (kept in float by the quantizer): DequantizeLinear, the op, QuantizeLinear"

    def _saturated(self, node, y: str, op: str, inputs: list, *domain, **attrs) -> None:
        """``op`` (which saturates to uint8) into activation ``y``, then a Clip to y's [qmin, qmax] where
        that is narrower than uint8's."""
        p = self.codes(node, y)
        full = (p.qmin, p.qmax) == (0, 255)
        t = self.emit(op, inputs, y if full else f"{y}::sat", *domain, **attrs)
        if not full:
            self.emit("Clip", [t, self.const(f"{y}::qmin", np.uint8(p.qmin)),
                               self.const(f"{y}::qmax", np.uint8(p.qmax))], y)

    def _zero_point(self, name: str) -> np.float32:
        return np.float32(int(self.graph.values[name].quant.zero_point))

    def _as_float(self, node, name: str) -> str:
        """``name``'s codes as float ``q - zp`` (made once)."""
        if name in self._float_names:
            return self._float_names[name]
        self.codes(node, name)
        if name not in self._float_names:  # (q - zp) * 1: exact, one pass where Cast and Sub took two
            self._float_names[name] = self.emit("DequantizeLinear", [name, self.const("unit_scale", np.float32(1)),
                                                                     self.zero_point(node, name)], f"{name}::f")
        return self._float_names[name]

    # -- compute ---------------------------------------------------------------------------
    def _compute(self, node):
        """Conv, Gemm and MatMul by a [K, N] constant as QLinearConv; a Gemm or MatMul channels-last:
        its input [..., K] read as [1, M, 1, K] (every row one pixel: one matrix product however many
        rows), its output reshaped back. Channels no float32 scale reproduces run apart (``_rest``)."""
        if node.op not in ("Conv", "Gemm", "MatMul") or node.attrs.get("activation") == "LeakyRelu":
            return self._in_float(node, "no QLinearConv form")
        x, y = node.inputs[0], node.outputs[0]
        for name in (x, y):
            self.codes(node, name)  # (uint8 per-tensor activations, or a refusal)
        prep = self.plain._prep_compute(node)
        if node.op == "MatMul" and prep["w"].ndim != 2:
            return self._in_float(node, "a MatMul by a constant of more than two dims")
        scales, bias, proven = self._scales(node)
        rest = np.flatnonzero(~proven)
        group = node.attrs.get("group", 1) if node.op == "Conv" else 1
        channels_last = node.op != "Conv"
        w = prep["w"] if node.op == "Conv" else \
            (prep["w"] if node.op == "Gemm" and node.attrs["transB"] else prep["w"].T)[:, :, None, None]
        if rest.size and not (group == 1 or (group == w.shape[0] and w.shape[1] == 1)):
            return self._in_float(node, "a grouped convolution with channels no float32 scale reproduces")
        if rest.size and prep["ftype"] is not torch.float32 and prep["bound"] >= 2**31:
            return self._in_float(node, "channels no float32 scale reproduces, with accumulators beyond int32")
        x4 = x
        if channels_last:
            x4 = self.emit("Reshape", [x, self.const(f"{node.name}::rows", np.int64([1, -1, 1, w.shape[1]]))],
                           f"{x}::{node.name}::rows")
        attrs = {k: v for k, v in node.attrs.items() if k not in FUSED_ATTRS and v is not None and v != []} \
            if node.op == "Conv" else {}
        per_sample = self.graph.values[y].shape[1:]
        small = all(isinstance(d, int) for d in per_sample) and int(np.prod(per_sample)) <= SMALL_OUTPUT
        if rest.size and (rest.size * 2 > len(proven) or small) and \
                self._apart_form(node, w, attrs, channels_last) != "conv":
            # most channels apart: all of them on the integer kernel, no QLinearConv to merge with (random-weight
            # RepVGG: 160 of 192 channels apart, computed twice); or a small output, where the merge's nodes cost
            # more than the kernel's passes (kws_dscnn1d's classifier, 4 of 12 apart: 5 nodes fewer)
            t, _ = self._rest(node, x4, w, np.arange(len(proven)), attrs, channels_last)
            if not channels_last:  # (channels-last, [N, H, W, C])
                t = self.emit("Transpose", [t], y, perm=[0, 3, 1, 2])
            self.report[node.name] = f"{rest.size} of {len(proven)} channels no float32 scale reproduces: all " \
                                     f"{self.report.pop(node.name + '::rest')}"
        else:
            t = self._qlinear_conv(node, x4, w, scales, bias, proven, attrs)
        if channels_last:  # [1, M, 1, N] back to [..., N]
            self.emit("Reshape", [t, self._rows_shape(node, x, w.shape[0])], y)

    def _rows_shape(self, node, x: str, last: int) -> str:
        """The shape of ``x`` ([..., K]) with ``last`` for its last axis, for a Reshape back from rows: a
        constant where only the batch axis is unknown (two nodes fewer per linear layer), else computed."""
        xs = self.graph.values[x].shape
        if len(xs) >= 2 and all(isinstance(d, int) for d in xs[1:-1]):
            return self.const(f"{node.name}::out_shape", np.int64([-1, *xs[1:-1], last]))
        lead = self.emit("Shape", [x], f"{node.outputs[0]}::{node.name}::lead", end=-1)
        return self.emit("Concat", [lead, self.const(f"{node.name}::n", np.int64([last]))],
                         f"{node.outputs[0]}::{node.name}::shape", axis=0)

    def _qlinear_conv(self, node, x4: str, w: np.ndarray, scales, bias, proven, attrs: dict) -> str:
        """QLinearConv with the proven ``scales``, its fused activation's clip, and the channels not
        ``proven`` computed apart and merged in; -> its output ([1, M, 1, N] for a channels-last one)."""
        x, y = node.inputs[0], node.outputs[0]
        channels_last = node.op != "Conv"
        lo, hi = self.plain._prep_compute(node)["bounds"]
        rest = np.flatnonzero(~proven)
        per_channel = not (isinstance(lo, int) and isinstance(hi, int))  # an equalized model's fused Relu6
        narrow = per_channel or (lo, hi) != (self.codes(node, y).qmin, self.codes(node, y).qmax)
        stages = ["conv"] + ["clip"] * narrow + ["merge"] * bool(rest.size) + ["reshape"] * channels_last
        out = {stage: (y if stage == stages[-1] else f"{y}::{stage}") for stage in stages}
        one = self.const("unit_scale", np.float32(1))
        w_codes, w_zp = self._weights(w, scales.shape)
        ins = [x4, one, self.zero_point(node, x), self.const(f"{node.name}::w", w_codes),
               self.const(f"{node.name}::w_scale", scales), self.const(f"{node.name}::w_zp", w_zp), one,
               self.zero_point(node, y)]
        if bias is not None:
            ins.append(self.const(f"{node.name}::b", bias.astype(np.int32)))
        if channels_last:  # ONNX Runtime's channels-last QLinearConv
            t = self.emit("QLinearConv", ins, out["conv"], domain="com.microsoft", channels_last=1)
        else:
            t = self.emit("QLinearConv", ins, out["conv"], **attrs)
        if narrow and per_channel:  # Max / Min with [C, 1, ...] bounds (Clip takes scalars only)
            rank = 2 if channels_last else len(self.graph.values[y].shape)  # (channels-last: bounds [C])
            bound = lambda v: np.broadcast_to(np.asarray(v), (w.shape[0],)).astype(np.uint8).reshape(  # noqa: E731
                (-1,) + (1,) * (rank - 2))
            t = self.emit("Max", [t, self.const(f"{y}::lo_c", bound(lo))], f"{y}::max")
            t = self.emit("Min", [t, self.const(f"{y}::hi_c", bound(hi))], out["clip"])
        elif narrow:  # a fused Relu / Clip narrower than the type
            t = self.emit("Clip", [t, self.const(f"{y}::lo", np.uint8(lo)), self.const(f"{y}::hi", np.uint8(hi))],
                          out["clip"])
        self.report[node.name] = "QLinearConv"
        if rest.size:
            r, rest_last = self._rest(node, x4, w, rest, attrs, channels_last)
            t = self._merge(node, t, r, rest, len(proven), channels_last, rest_last, out["merge"])
            self.report[node.name] += f"; {rest.size} of {len(proven)} channels: {self.report.pop(node.name + '::rest')}"
        return t

    def _merge(self, node, t: str, r: str, rest: np.ndarray, channels: int, channels_last: bool, rest_last: bool,
               out: str) -> str:
        """QLinearConv's codes ``t`` with the channels ``rest`` replaced by ``r`` (``_rest``'s).

        Few channels apart (at most one in SCATTER_FRACTION): a ``ScatterElements`` of ``r`` into
        ``t`` on the channels-last axis. ONNX Runtime runs QLinearConv channels-last, so the
        Transposes around the scatter cancel with its own: one copy of ``t`` and the few updates,
        and the graph stays channels-last for the next QLinearConv or MaxPool (a uint8 MaxPool left
        channels-first took 1.5 ms where ONNX Runtime's channels-last one took 30 us).
        Many: one Concat, then a Gather that puts the channels back in order on a channels-first
        axis (a Gather on the channels-last axis copies byte by byte; on axis 1 it copies planes)."""
        y = node.outputs[0]
        rank = len(self.graph.values[y].shape)
        if rest.size * SCATTER_FRACTION <= channels and (channels_last or rank == 4):
            if not (channels_last or rest_last):  # ConvInteger's few channels, [N, r, H, W]: a small Transpose
                r = self.emit("Transpose", [r], f"{y}::rest_nhwc", perm=[0, 2, 3, 1])
            index = self.const(f"{node.name}::rest_at", rest.astype(np.int64).reshape(1, 1, 1, -1))
            index = self.emit("Expand", [index, self.emit("Shape", [r], f"{y}::rest_shape")], f"{y}::rest_index")
            merged = self.emit("ScatterElements", [t if channels_last else self._nhwc(t), index, r],
                               out if channels_last else f"{y}::merged_nhwc", axis=3)
            return merged if channels_last else self.emit("Transpose", [merged], out, perm=[0, 3, 1, 2])
        perm = np.arange(channels)
        perm[rest] = channels + np.arange(rest.size)
        if channels_last:  # rows of channels: channels first, so that the Gather copies whole rows
            merged = self.emit("Concat", [t, r], f"{y}::both_last", axis=3)
            merged = self.emit("Transpose", [merged], f"{y}::both", perm=[3, 0, 1, 2])
        elif rest_last:  # joined as ONNX Runtime runs QLinearConv, channels-last, then one Transpose back
            merged = self.emit("Concat", [self._nhwc(t), r], f"{y}::both_nhwc", axis=3)
            merged = self.emit("Transpose", [merged], f"{y}::both", perm=[0, 3, 1, 2])
        else:
            merged = self.emit("Concat", [t, r], f"{y}::both", axis=1)
        t = self.emit("Gather", [merged, self.const(f"{node.name}::perm", perm)],
                      f"{y}::picked" if channels_last else out, axis=0 if channels_last else 1)
        return self.emit("Transpose", [t], out, perm=[1, 2, 3, 0]) if channels_last else t

    @staticmethod
    def _weights(w: np.ndarray, zp_shape) -> tuple:
        """(weight codes, zero point) for QLinearConv: int8 as they are where ONNX Runtime's u8s8
        kernels are exact (x86 with VNNI), else uint8 ``w + 128``, zero point 128, for its u8u8
        kernels (see the module docstring)."""
        if signed_weights_exact():
            return w.astype(np.int8), np.zeros(zp_shape, np.int8)
        return uint8_weights(w), np.full(zp_shape, 128, np.uint8)

    def _nhwc(self, name: str) -> str:
        """``name`` ([N, C, H, W]) channels-last, made once."""
        if f"{name}::nhwc" not in self._made:
            self._made.add(f"{name}::nhwc")
            self.emit("Transpose", [name], f"{name}::nhwc", perm=[0, 2, 3, 1])
        return f"{name}::nhwc"

    def _rest(self, node, x4: str, w: np.ndarray, rest: np.ndarray, attrs: dict, channels_last: bool = False):
        """The channels ``rest`` of a Conv (or a Gemm / MatMul, ``x4`` then already channels-last)
        as ONNX Runtime's exact integer kernels (:meth:`_apart_form`): ``MatMulInteger`` on the
        channels-last input (or its columns), with int8 weights where u8s8 is exact as for
        QLinearConv, else u8u8 ``ConvInteger``; their int32 sums held as
        float32 (float64 past 2^24) and the float lowering's proven requantization formula (the bias
        added in float64);
        -> (their uint8 codes, whether channels-last: [N, H, W, len(rest)], else [N, len(rest), H, W])."""
        prep = self.plain._prep_compute(node)
        y = node.outputs[0]
        depthwise = attrs.get("group", 1) > 1
        form = self._apart_form(node, w, attrs, channels_last)
        columns, last = form == "columns", form != "conv"  # a MatMulInteger, channels-last out
        x_zp = self.zero_point(node, node.inputs[0])
        if last:  # u8s8 where exact: ONNX Runtime's MatMulInteger ran 2.2x its u8u8
            x_last = x4 if channels_last else self._nhwc(x4)
            if columns:
                x_last = self._columns(node, x_last, w.shape[2:], attrs, self.graph.values[y].shape[2:], x_zp)
            # [C_out, C_in, kh, kw] -> [(i, j, c), C_out], the columns' order
            wt, w_zp = self._weights(w[rest].transpose(2, 3, 1, 0).reshape(-1, rest.size), ())
            acc = self.emit("MatMulInteger", [x_last, self.const(f"{node.name}::rest_wt", wt), x_zp,
                                              self.const(f"w_zp_{w_zp.dtype}", w_zp)], f"{node.name}::rest_acc")
        else:  # u8u8 on every CPU: with int8 weights ONNX Runtime's ConvInteger ran slower (docs/benchmarks.md)
            xin = self.emit("Gather", [x4, self.const(f"{node.name}::rest_in", rest)], f"{node.name}::rest_x",
                            axis=1) if depthwise else x4
            acc = self.emit("ConvInteger", [xin, self.const(f"{node.name}::rest_w", uint8_weights(w[rest])), x_zp,
                                            self.const("w_zp128", np.uint8(128))],
                            f"{node.name}::rest_acc", **{**attrs, **({"group": int(rest.size)} if depthwise else {})})
        # int32 sums: float32 holds them exactly below 2^24, float64 always
        wide = prep["ftype"] is not torch.float32
        accf = self.emit("Cast", [acc], f"{node.name}::rest_accf", to=TensorProto.DOUBLE if wide else TensorProto.FLOAT)
        a, b, lo, hi = (v[rest] for v in channel_ranges(self.plain, node))
        bias = np.zeros(rest.size, np.int64) if prep["bias"] is None else \
            np.broadcast_to(prep["bias"], (len(prep["rows"]),))[rest].astype(np.int64)
        f32 = self._float_builder()
        if not wide:
            self.exact_int[accf] = acc
        part = dataclasses.replace(node, name=f"{node.name}::rest", outputs=[f"{y}::rest_f"])
        how = f32._requantize(node, channel_subset(prep, rest), accf, bias, a, b, lo, hi,
                              [-1] if last else [-1, 1, 1], np.float64 if wide else np.float32, part)
        self.report[part.name] = ("MatMulInteger, " if last else "ConvInteger, ") + how
        return self.emit("QuantizeLinear", [f"{y}::rest_f", self.const("unit_scale", np.float32(1)),
                                            self.zero_point(node, y)], f"{y}::rest_q"), last

    def _apart_form(self, node, w: np.ndarray, attrs: dict, channels_last: bool) -> str:
        """How ``_rest`` computes channels apart: ``matmul`` (a pointwise kernel, or a Gemm / MatMul),
        ``columns`` (a wider one as a matrix product of its input's columns, where ONNX Runtime's u8s8
        kernels are exact: tv_deeplabv3's 3x3 of 960 channels over 10 x 10, 200 channels apart, took
        2.0 ms as u8u8 ConvInteger, where QLinearConv (u8s8) took 0.6 ms for all 256) or ``conv``
        (ConvInteger: grouped, or without exact u8s8)."""
        if channels_last or pointwise_conv(w.shape, attrs):
            return "matmul"
        if attrs.get("group", 1) == 1 and signed_weights_exact() and w.ndim == 4 and \
                all(isinstance(d, int) for d in self.graph.values[node.outputs[0]].shape[2:]):
            return "columns"
        return "conv"

    def _columns(self, node, x_last: str, kernel: tuple, attrs: dict, out_hw: tuple, x_zp: str) -> str:
        """The input columns of a convolution, channels-last: ``x_last`` [N, H, W, C] padded with its
        zero point, one strided Slice per kernel tap, joined -> [N, H_out, W_out, kh kw C] (tap-major)."""
        (kh, kw), (ho, wo) = kernel, out_hw
        sh, sw = attrs.get("strides", [1, 1])
        dh, dw = attrs.get("dilations", [1, 1])
        top, left, bottom, right = attrs.get("pads", [0, 0, 0, 0])
        pre = f"{node.name}::rest_cols"
        if top or left or bottom or right:
            pads = self.const(f"{pre}::pads", np.int64([0, top, left, 0, 0, bottom, right, 0]))
            x_last = self.emit("Pad", [x_last, pads, x_zp], f"{pre}::padded")
        taps = []
        for i in range(kh):
            for j in range(kw):
                starts = [i * dh, j * dw]
                ends = [starts[0] + (ho - 1) * sh + 1, starts[1] + (wo - 1) * sw + 1]
                taps.append(self.emit("Slice", [x_last, self.const(f"{pre}::{i}_{j}_start", np.int64(starts)),
                                                self.const(f"{pre}::{i}_{j}_end", np.int64(ends)),
                                                self.const("axes_1_2", np.int64([1, 2])),
                                                self.const(f"{pre}::steps", np.int64([sh, sw]))], f"{pre}::{i}_{j}"))
        return self.emit("Concat", taps, pre, axis=3)

    def _scales(self, node):
        """(float32 scales [C], int32 bias [C] or None, proven [C]): with unit x and y
        scales, QLinearConv's ``rint(float32(acc + bias) * s)`` is proven equal to the
        node's requantization on every accumulator channel c can reach where
        ``proven[c]``.

        ONNX Runtime adds the bias in int32, so each channel's accumulators must stay
        in int32. A channel whose output is one constant over its range (a dead
        channel, say, its bias saturated at int32's end) gets scale 1 and a bias
        that gives that constant with the range inside int32.

        Proven once per process for each distinct rule and range (:func:`_proof_key`): the
        configurations a mixed-precision search builds share most of their layers."""
        plain = self.plain
        prep = plain._prep_compute(node)
        a, b, lo, hi = channel_ranges(plain, node)
        key = _proof_key(plain, node, prep, a, b, lo, hi)
        if key not in _PROVEN:
            if len(_PROVEN) >= 4096:
                _PROVEN.clear()
            _PROVEN[key] = self._prove_scales(node, prep, a, b, lo, hi)
        return tuple(None if v is None else v.copy() for v in _PROVEN[key])

    def _prove_scales(self, node, prep, a, b, lo, hi):
        plain = self.plain
        rule = requant_rule(plain, node, prep, lo, hi)
        bias = np.zeros(a.shape, np.int64) if prep["bias"] is None else \
            np.broadcast_to(prep["bias"], a.shape).astype(np.int64)
        ends = rule(np.stack([a, b], axis=1))
        # constant channels: scale 1 and the accumulators pushed beyond the clamp (or onto the constant)
        constant = (ends[:, 0] == ends[:, 1]) & ((ends[:, 0] == lo) | (ends[:, 0] == hi) | (a == b))
        half = (b - a) // 2
        fixed = np.where(ends[:, 0] == lo, -(2**31) + 1 + half, np.where(ends[:, 0] == hi, 2**31 - 1 - half,
                                                                           ends[:, 0]))
        bias = np.where(constant, fixed, bias)
        a, b = np.where(constant, bias - half, a), np.where(constant, bias + half, b)
        in_int32 = (a >= -(2**31)) & (b < 2**31)
        bias = np.where(in_int32, bias, 0)  # (those channels are computed apart)
        a, b = np.where(in_int32, a, 0), np.where(in_int32, b, 0)

        def exact(acc: np.ndarray) -> np.ndarray:
            return np.where(constant[:, None], ends[:, :1], rule(acc))

        if plain.rounding == "onnx":  # the rule itself: only the constant channels need a proof
            scales = np.where(constant, np.float32(1), np.broadcast_to(np.asarray(prep["scale"], np.float32), a.shape))
            proven = np.ones(a.shape, bool)
            k = np.flatnonzero(constant)
            if k.size:
                proven[k] = verify(lambda acc: np.broadcast_to(ends[k, :1], acc.shape), Formula(scales[k], rnd="round"),
                                   a[k], b[k], lo[k], hi[k])
        else:
            m = np.broadcast_to(multiplier_value(prep["M"], prep["S"]), a.shape)
            candidates = [np.where(constant, np.float32(1), float32_nudged(m, ulps)) for ulps in SCALE_NUDGES]
            formula, proven = fit_channels(exact, [Formula(s, rnd="round") for s in candidates], a, b, lo, hi)
            scales = candidates[0] if formula is None else formula.r
        keep_bias = prep["bias"] is not None or constant.any()
        return scales.astype(np.float32), (bias if keep_bias else None), proven & in_int32

    def _elementwise(self, node):
        two_activations = not any(f"input{k}" in node.quant for k in range(2)) and node.inputs[0] != node.inputs[1]
        if node.op == "Add" and two_activations:
            return self._add(node)
        consts = [k for k in range(2) if f"input{k}" in node.quant]
        if node.op == "Add" and len(consts) == 1 and self._add_constant(node, 1 - consts[0]):
            return
        if node.op == "Mul" and len(consts) == 1 and self.plain.rounding != "onnx" and \
                self._mul_per_channel(node, 1 - consts[0]):
            return
        if self.plain.rounding != "onnx":
            return self._in_float(node, "fixed-point arithmetic")
        if node.op != "Mul" or not two_activations:
            return self._in_float(node, "no QLinear form")
        a, b = node.inputs[:2]
        self.emit(f"QLinear{node.op}", [a, *self.qparams(node, a), b, *self.qparams(node, b),
                                       *self.qparams(node, node.outputs[0])], node.outputs[0], "com.microsoft")

    def _add(self, node):
        """An Add of two same-shaped activations as ``QLinearAdd`` with ratios proven equal to
        the plain simulator's table of all 256 x 256 results (:mod:`npuforge.sim.qlinear_add`)."""
        g = self.graph
        a, b = node.inputs[:2]
        qa, qb, qy = self.codes(node, a), self.codes(node, b), self.codes(node, node.outputs[0])
        if list(g.values[a].shape) != list(g.values[b].shape):
            return self._in_float(node, "a broadcast operand (QLinearAdd rounds it another way)")
        codes = torch.arange(256, dtype=torch.uint8)
        table = self.plain._elementwise(node, {a: codes[:, None], b: codes[None, :]})[0].numpy()
        za, zb, zy = (int(q.zero_point) for q in (qa, qb, qy))
        ratios = qlinear_add.fit(table, za, zb, zy, float(qa.scale) / float(qy.scale), float(qb.scale) / float(qy.scale))
        if ratios is None:
            return self._in_float(node, "no QLinearAdd ratios proven equal to its table")
        ins = [a, self.const(f"{node.name}::ra", ratios[0]), self.zero_point(node, a),
               b, self.const(f"{node.name}::rb", ratios[1]), self.zero_point(node, b),
               self.const("unit_scale", np.float32(1)), self.zero_point(node, node.outputs[0])]
        self.emit("QLinearAdd", ins, node.outputs[0], "com.microsoft")
        self.report[node.name] = "QLinearAdd (ratios proven on every pair of codes)"

    def _add_constant(self, node, k: int) -> bool:
        """An Add of activation ``k`` and an 8-bit per-tensor constant (a linear layer's bias after
        its MatMul) as ``QLinearAdd`` with ratios proven on every pair of codes, the constant's
        codes (int8 moved to uint8 with their zero point) expanded to the activation's shape, as
        QLinearAdd's same-shape kernel needs; False (nothing emitted) where that does not apply."""
        g = self.graph
        x, c, y = node.inputs[k], node.inputs[1 - k], node.outputs[0]
        qx, qy, qc = self.codes(node, x), self.codes(node, y), g.values[c].quant
        if qc is None or qc.dtype not in ("int8", "uint8") or qc.per_channel:
            return False
        role = f"input{1 - k}"
        codes = np.asarray(self.plain._int(node, role)).astype(np.int64)
        xs = list(g.values[x].shape)
        lead = len(xs) - codes.ndim
        if lead < 0 or any(d != 1 and d != xs[lead + i] for i, d in enumerate(codes.shape)):
            return False  # the constant would widen the output
        shift = 128 if qc.dtype == "int8" else 0
        probe = dataclasses.replace(node, quant={r: v for r, v in node.quant.items() if r != role})
        feeds = {x: torch.arange(256, dtype=torch.uint8)[:, None],
                 c: torch.from_numpy((np.arange(256) - shift).astype(NP_INT[qc.dtype]))[None, :]}
        table = self.plain._elementwise(probe, feeds)[0].numpy()  # [x's code, constant's code + shift]
        zx, zc, zy = int(qx.zero_point), int(qc.zero_point) + shift, int(qy.zero_point)
        ratios = qlinear_add.fit(table, zx, zc, zy, float(qx.scale) / float(qy.scale),
                                 float(qc.scale) / float(qy.scale))
        if ratios is None:
            return False
        c_codes = (codes + shift).astype(np.uint8)
        if xs and (lead > 0 or codes.shape[0] == 1) and all(isinstance(d, int) for d in xs[1:]) and \
                int(np.prod(xs[1:])) <= EXPANDED_BYTES:
            # one sample's shape, stored: QLinearAdd broadcasts it over the batch axis alone, one same-shape
            # span per sample (its same-shape kernel); no Shape and Expand at run time
            wide = self.const(f"{node.name}::c_wide",
                              np.ascontiguousarray(np.broadcast_to(c_codes.reshape((1,) * lead + codes.shape),
                                                                   [1, *xs[1:]])))
        else:
            wide = self.emit("Expand", [self.const(f"{node.name}::c", c_codes),
                                        self.emit("Shape", [x], f"{node.name}::shape")], f"{node.name}::c_wide")
        ins = [x, self.const(f"{node.name}::ra", ratios[0]), self.zero_point(node, x),
               wide, self.const(f"{node.name}::rb", ratios[1]), self.const(f"{node.name}::zc", np.uint8(zc)),
               self.const("unit_scale", np.float32(1)), self.zero_point(node, y)]
        self.emit("QLinearAdd", ins, y, "com.microsoft")
        self.report[node.name] = "QLinearAdd of the constant's codes (ratios proven on every pair of codes)"
        return True

    def _mul_per_channel(self, node, k: int) -> bool:
        """A fixed-point Mul of activation ``k`` by a constant with one value per channel (a batch
        norm after a Concat, a layer scale) or one value (attention's scaling, taken as one per
        last-axis channel) as a depthwise 1x1 ``QLinearConv``: the weights are the
        constant's codes, its zero point theirs, so the accumulator is the rule's product
        ``(x - zp_x) (c - zp_c)``, and each channel's float32 scale is proven equal to the rule's
        requantization on the channel's whole product range (:func:`fit_channels`). A [N, C, H, W]
        activation with a [C, 1, 1] constant, or any [..., C] with [C] (ONNX Runtime's channels-last
        QLinearConv on [1, rows, 1, C]); False (nothing emitted) elsewhere, or where a channel has no
        such scale. densenet121 at batch 1: 19.7 -> 9.2 ms (a table lookup per element before)."""
        g = self.graph
        x, c, y = node.inputs[k], node.inputs[1 - k], node.outputs[0]
        qx, qy, qc = self.codes(node, x), self.codes(node, y), g.values[c].quant
        shape = list(g.values[x].shape)
        if qc is None or qc.dtype != "uint8" or qc.per_channel or len(shape) < 2:
            return False
        codes = np.asarray(self.plain._int(node, f"input{1 - k}")).astype(np.int64)
        if codes.size == 1 and isinstance(shape[-1], int) and codes.ndim <= len(shape):  # one value: the same
            codes = np.broadcast_to(codes.reshape(-1), (shape[-1],))                      # in every last-axis channel
        trailing = codes.shape[next((i for i, d in enumerate(codes.shape) if d != 1), codes.ndim):]
        channels_last = trailing == (shape[-1],)
        if codes.ndim > len(shape) or not (channels_last or len(shape) == 4 and trailing == (shape[1], 1, 1)):
            return False  # not one value per channel on the last axis or on a 4-D value's second
        w, zc = codes.reshape(-1), int(qc.zero_point)
        zx, zy = int(qx.zero_point), int(qy.zero_point)
        product = (w - zc)[:, None] * np.array([qx.qmin - zx, qx.qmax - zx])
        a, b = product.min(axis=1), product.max(axis=1)
        lo, hi = np.full(a.shape, qy.qmin - zy), np.full(a.shape, qy.qmax - zy)
        multiplier, shift_ = int(self.plain._int(node, "multiplier")[0]), int(self.plain._int(node, "shift")[0])

        def exact(acc: np.ndarray) -> np.ndarray:
            out = self.plain._R(torch.from_numpy(acc), multiplier, shift_).numpy()
            return np.clip(out, lo[:, None], hi[:, None])

        m = np.full(a.shape, multiplier_value(multiplier, shift_))
        formula, proven = fit_channels(exact, [Formula(float32_nudged(m, u), rnd="round") for u in SCALE_NUDGES],
                                       a, b, lo, hi)
        if formula is None or not proven.all():
            return False
        channels = codes.size
        ins = [x, self.const("unit_scale", np.float32(1)), self.zero_point(node, x),
               self.const(f"{node.name}::w", w.astype(np.uint8).reshape(channels, 1, 1, 1)),
               self.const(f"{node.name}::w_scale", formula.r.astype(np.float32)),
               self.const(f"{node.name}::w_zp", np.uint8(zc)), self.const("unit_scale", np.float32(1)),
               self.zero_point(node, y)]
        if not channels_last:
            self.emit("QLinearConv", ins, y, group=channels)
        else:
            ins[0] = self.emit("Reshape", [x, self.const(f"{node.name}::rows", np.int64([1, -1, 1, channels]))],
                               f"{x}::{node.name}::rows")
            t = self.emit("QLinearConv", ins, f"{y}::rows", domain="com.microsoft", channels_last=1, group=channels)
            self.emit("Reshape", [t, self._rows_shape(node, x, channels)], y)
        self.report[node.name] = "QLinearConv, depthwise (its scales proven on each channel's product range)"
        return True

    def _pool(self, node):
        """GlobalAveragePool, and ReduceMean over the same axes (every one after the channels,
        kept: a squeeze-and-excitation block's), as com.microsoft ``QLinearGlobalAveragePool``,
        which outputs ``rint(float32(sum) * s)`` of each channel's int32 sum of ``q - zp``, ``s``
        the float32 ``x_scale / (y_scale * count)``: a GlobalAveragePool's ``onnx`` rounding by
        definition; otherwise with ``x_scale`` a float32 near the rule's ``s_x / s_y`` and
        ``y_scale`` 1, kept where :func:`~npuforge.sim.monotone_fit.fit` proves it equal to the
        node's rule on every sum the input's codes can reach (:meth:`_pool_scale`). Else in float."""
        x, y = node.inputs[0], node.outputs[0]
        shape = self.graph.values[x].shape
        if not self._spatial_mean(node, shape) or not all(isinstance(d, int) for d in shape[2:]):
            return self._in_float(node, "no QLinear form")
        if self.plain.rounding == "onnx" and node.op == "GlobalAveragePool":
            scales = [self.qparams(node, x)[0], self.qparams(node, y)[0]]
        else:
            x_scale = self._pool_scale(node, int(np.prod(shape[2:])))
            if x_scale is None:
                return self._in_float(node, "no float32 scale reproduces its rounding")
            scales = [self.const(f"{node.name}::x_scale", x_scale), self.const("unit_scale", np.float32(1))]
        self._saturated(node, y, "QLinearGlobalAveragePool", [x, scales[0], self.zero_point(node, x), scales[1],
                                                             self.zero_point(node, y)], "com.microsoft", channels_last=0)
        self.report[node.name] = "QLinearGlobalAveragePool" + ("" if self.plain.rounding == "onnx" else
                                                               " (its scale proven on every sum)")

    def _spatial_mean(self, node, shape) -> bool:
        """Whether ``node`` averages each channel over every axis after it, keeping them."""
        if len(shape) < 3:
            return False
        if node.op == "GlobalAveragePool":
            return True
        if node.op != "ReduceMean" or not node.attrs.get("keepdims", 1) or len(node.inputs) < 2 or \
                not node.inputs[1] or not self.graph.values[node.inputs[1]].is_const:
            return False
        axes = sorted(int(a) % len(shape) for a in np.asarray(self.graph.values[node.inputs[1]].data).reshape(-1))
        return axes == list(range(2, len(shape)))

    def _pool_scale(self, node, count: int) -> np.float32 | None:
        """The float32 x_scale (y_scale 1) whose ``rint(float32(sum) * float32(x_scale / count))``
        equals the node's rule, clamped, on every sum of ``count`` codes; None where no scale
        within 64 ulps of ``s_x / s_y`` does (a rule rounding half away from zero on sums of both
        signs, say)."""
        xq, yq = self.codes(node, node.inputs[0]), self.codes(node, node.outputs[0])
        zx, zy = int(xq.zero_point), int(yq.zero_point)
        a, b = np.array([count * (xq.qmin - zx)]), np.array([count * (xq.qmax - zx)])
        lo, hi = np.array([yq.qmin - zy]), np.array([yq.qmax - zy])

        def exact(total: np.ndarray) -> np.ndarray:
            y = self.plain.pool_output(node, torch.from_numpy(total), torch.tensor(count)).numpy()
            return np.clip(y, yq.qmin, yq.qmax) - zy

        x_scales = [float32_nudged(np.array([float(xq.scale) / float(yq.scale)]), ulps) for ulps in POOL_NUDGES]
        candidates = [Formula(s / np.float32(count), rnd="round") for s in x_scales]  # ONNX Runtime's float32 s
        formula, proven = fit_channels(exact, candidates, a, b, lo, hi)
        if not proven[0]:
            return None
        return next(s for s, f in zip(x_scales, candidates) if f.r[0] == formula.r[0])[0]

    def _matmul(self, node):
        """A MatMul of two activations (attention's Q K^T and its weights times V) as QLinearMatMul,
        whose u8u8 product is exact in int32 and whose ``rint(float32(acc) * s)`` is proven equal to
        the node's requantization on [-bound, bound] for some float32 ``s`` near its multiplier;
        else the float lowering's exact product."""
        a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
        qa, qb, qy = (self.codes(node, n) for n in (a, b, y))
        ranges = matmul_ranges(self.plain, node)
        if ranges is None or ranges[1][0] >= 2**31:
            return self._in_float(node, "a MatMul of two activations beyond int32: the float lowering's product")
        prep = matmul_rule(self.plain, node, qa, qb, qy)
        lo, hi, ends = ranges[2], ranges[3], ranges[:2]
        if self.plain.rounding == "onnx":
            scales = [np.asarray(prep["scale"], np.float32).reshape(1)]
        else:
            m = np.broadcast_to(multiplier_value(prep["M"], prep["S"]), (1,))
            scales = [float32_nudged(m, ulps) for ulps in SCALE_NUDGES]
        formula, proven = fit_channels(requant_rule(self.plain, node, prep, lo, hi),
                                       [Formula(s, rnd="round") for s in scales], *ends, lo, hi)
        if formula is None or not proven.all():
            return self._in_float(node, "a MatMul of two activations no float32 scale reproduces")
        one = self.const("unit_scale", np.float32(1))
        scale = self.const(f"{node.name}::s", np.float32(formula.r[0]))
        self.emit("QLinearMatMul", [a, scale, self.zero_point(node, a), b, one, self.zero_point(node, b), one,
                                    self.zero_point(node, y)], y)
        self.report[node.name] = "QLinearMatMul (its float32 scale proven on every accumulator)"

    def _softmax(self, node):
        return self._in_float(node, "no QLinear form that computes the integer rule")

    def _layernorm(self, node):
        return self._in_float(node, "no QLinear form that computes the integer rule")

    def _interpolate(self, node):
        return self._in_float(node, "no QLinear form that computes the integer rule")

    def _minmax(self, node):
        return self._in_float(node, "its operands' requantizations as tables")

    def _prelu(self, node):
        return self._in_float(node, "a table per slope element")

    def _divide(self, node):
        return self._in_float(node, "a table of the quotients")

    def _lut(self, node):
        """A lookup op: ONNX Runtime's own QLinear form of it where the table that kernel builds equals
        the plain path's on all 256 codes (:func:`_table_op`), else a lookup in that table."""
        x, y = node.inputs[0], node.outputs[0]
        px, py = self.codes(node, x), self.codes(node, y)
        table = self.plain._table(node).numpy().astype(np.uint8)  # indexed by the uint8 code (qmin 0)
        op = _table_op(node, px, py, table)
        if op is not None:
            op_type, attrs = op
            self.emit(op_type, [x, *self.qparams(node, x), *self.qparams(node, y)], y, domain="com.microsoft",
                      **attrs)
            self.report[node.name] = f"{op_type} (its table equal to the plain one on every code)"
            return
        idx = self.emit("Cast", [x], f"{node.name}::idx", to=TensorProto.INT32)
        self.lookup(self.const(f"{node.name}::table", table), idx, y)

    def _passthrough(self, node):
        g = self.graph
        if node.op not in MOVERS:
            return self._in_float(node, "no uint8 form")
        if node.op == "Concat" and any(g.values[n].is_const for n in node.inputs):
            return self._in_float(node, "a constant input (the float lowering writes its codes)")
        if node.op == "Gather" and g.values[node.inputs[0]].is_const:
            return self._lookup_rows(node)
        if node.op == "Pad":
            return self._pad(node)
        if node.op == "MaxPool" and len(g.values[node.inputs[0]].shape) == 4 and \
                len([o for o in node.outputs if o]) == 1:
            return self._maxpool(node)
        self.codes(node, node.inputs[0])
        for name in node.inputs[1:]:
            if name and node.op == "Concat":
                self.codes(node, name)
            elif name and not g.values[name].is_const:
                self.refuse(node, f"input '{name}' is computed")
            elif name:
                self.const(name, np.asarray(g.values[name].data))
        if node.op == "Concat":
            p = g.values[node.outputs[0]].quant
            if not all(g.values[n].quant.same_as(p) for n in node.inputs):
                self.refuse(node, "inputs with other parameters than the output's")
        self.nodes.extend(_nodes_of(g, node))

    _concat = _passthrough

    def _maxpool(self, node):
        """A 2-D MaxPool of uint8 codes as ONNX Runtime's channels-last one (com.microsoft NhwcMaxPool)
        between Transposes, which cancel with its own around QLinearConv: its channels-first uint8
        MaxPool took 1.4 ms on [1, 16, 81, 81], the channels-last one with both Transposes 0.1 ms.
        ONNX Runtime converts a uint8 MaxPool itself only where the layout around it is already
        channels-last."""
        self.codes(node, node.inputs[0])
        y = node.outputs[0]
        attrs = {k: v for k, v in node.attrs.items() if k != "storage_order" and v is not None and v != []}
        nhwc = self.emit("NhwcMaxPool", [self._nhwc(node.inputs[0])], f"{y}::pooled_nhwc", domain="com.microsoft",
                         **attrs)
        self.emit("Transpose", [nhwc], y, perm=[0, 3, 1, 2])
        self.report[node.name] = "NhwcMaxPool"

    def _pad(self, node):
        """Pad on the uint8 codes, filling (constant mode) with the code of its float value as the
        plain path rounds it: 0.0, or no value given, is the zero point. On the codes, ONNX Runtime
        keeps the graph channels-last around it, where a float Pad left the MaxPool after it on
        ONNX Runtime's channels-first uint8 kernel (hgnetv2's stem: 1.1 ms, a fifth of the run)."""
        g = self.graph
        xq = self.codes(node, node.inputs[0])
        inputs = list(node.inputs) + [""] * (3 - len(node.inputs))
        for k, name in enumerate(inputs[1:], 1):
            if name and not g.values[name].is_const:
                self.refuse(node, f"input '{name}' is computed")
            if name and k != 2:  # (the fill value becomes its code below)
                self.const(name, np.asarray(g.values[name].data))
        value = float(np.asarray(g.values[inputs[2]].data).reshape(-1)[0]) if inputs[2] else 0.0
        inputs[2] = self.const(f"{node.name}::value", np.uint8(value_code(value, xq)))
        self.nodes.extend(_nodes_of(g, dataclasses.replace(node, inputs=inputs)))
        self.report[node.name] = "Pad of the codes"

    def _lookup_rows(self, node):
        """A Gather of a constant table by computed indices (token ids into an embedding): the
        table's uint8 codes, as the plain path reads them, gathered by ONNX Runtime's Gather."""
        g = self.graph
        table, index = node.inputs[:2]
        p, py = g.values[table].quant, g.values[node.outputs[0]].quant
        if p is None or p.dtype != "uint8" or p.per_channel or py is None or not p.same_as(py) or \
                not (g.values[index].is_const or self.is_index(index)):
            return self._in_float(node, "a constant table on another grid than its output's")
        self.const(table, self.plain._get(table, {}).numpy().astype(np.uint8))
        if g.values[index].is_const:
            self.const(index, np.asarray(g.values[index].data))
        self.nodes.extend(_nodes_of(g, node))
        self.report[node.name] = "Gather of the table's codes"


_TABLE_OPS: dict = {}  # (op, attributes, parameters, table) -> ONNX Runtime's op with that table, or None


def _copied(name: str, made_by: dict, kept: set) -> str:
    """The value ``name`` copies through Identity and one-input Concat nodes (itself if none, or a graph output)."""
    while name not in kept and (p := made_by.get(name)) is not None and \
            (p.op_type == "Identity" or p.op_type == "Concat" and len(p.input) == 1):
        name = p.input[0]
    return name


def _table_op(node, px, py, table: np.ndarray):
    """(op type, attributes) of ONNX Runtime's uint8 lookup kernel for ``node`` (QLinearLeakyRelu for
    Relu and LeakyRelu, QLinearSigmoid for Sigmoid) when the 256-entry table that kernel computes
    from the scales and zero points is ``table``, checked by running it on every code once per
    process; None otherwise. Such a kernel maps each code through its table, whatever the
    position, so equal tables give equal outputs."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    forms = {"Relu": ("QLinearLeakyRelu", {"alpha": 0.0}),
             "LeakyRelu": ("QLinearLeakyRelu", {"alpha": float(node.attrs.get("alpha", 0.01))}),
             "Sigmoid": ("QLinearSigmoid", {})}
    if node.op not in forms:
        return None
    op_type, attrs = forms[node.op]
    params = [np.float32(px.scale), np.uint8(px.zero_point), np.float32(py.scale), np.uint8(py.zero_point)]
    key = (op_type, repr(sorted(attrs.items())), *(p.tobytes() for p in params), table.tobytes())
    if key not in _TABLE_OPS:
        names = ["xs", "xz", "ys", "yz"]
        graph = helper.make_graph(
            [helper.make_node(op_type, ["x", *names], ["y"], domain="com.microsoft", **attrs)], "table",
            [helper.make_tensor_value_info("x", TensorProto.UINT8, [256])],
            [helper.make_tensor_value_info("y", TensorProto.UINT8, [256])],
            [numpy_helper.from_array(np.asarray(p), n) for p, n in zip(params, names)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            got = session.run(None, {"x": np.arange(256, dtype=np.uint8)})[0]
            _TABLE_OPS[key] = (op_type, attrs) if np.array_equal(got, table) else None
        except Exception:  # ONNX Runtime without the contrib kernel: the Gather form
            _TABLE_OPS[key] = None
    return _TABLE_OPS[key]
