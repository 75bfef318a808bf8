"""The integer simulator's fast path: the whole integer program as one ONNX graph of
float operations on exact small integers, run by ONNX Runtime.

Every value of the program is an integer code; here it is held, zero point
removed (``c = q - zp``), in a float32 tensor, which represents it exactly.
Each quantized node becomes a few standard ONNX ops whose result is *proven*
equal, bit for bit, to :class:`~npuforge.sim.integer.IntegerSimulator` (the
plain path, which stays the reference) before the graph is accepted:

* Conv / Gemm / MatMul with a constant weight: the float kernel with the integer
  weights and bias, exact by the accumulator bound of
  :func:`~npuforge.sim.int_ops.exact_float_dtype` (float32 only; zero padding
  of ``c`` is the zero point exactly); then the requantization as a short
  formula, ``clamp(floor(acc * r + b))`` (``round`` in the ``onnx`` mode, a
  sign-aware variant for rules that round half away from zero), in float32
  or float64, accepted only once :func:`~npuforge.sim.monotone_fit.fit` has
  proven it equal to the plain requantization on the whole accumulator range
  of every channel.
* MatMul of two activations (attention): the codes' product, exact in float32 or
  float64 by the bound ``K * max|a| * max|b|``, then one proven formula.
* Add / Sub / Mul of two 8-bit values: a table of all 256 x 256 results, computed
  by the plain path itself, read with ``Gather``; of one value with a constant (or
  with itself), a table of 256 results per element of the constant, or, for a large
  constant, per distinct code of it.
* GlobalAveragePool / ReduceMean: an exact ``ReduceSum``, then a table over every
  possible sum (again computed by the plain path); AveragePool: exact window sums
  (explicit Pad, a depthwise Conv of ones), then one such table per window count.
* Lookup ops: the plain path's table, read with ``Gather``.
* Softmax, LayerNormalization, InstanceNormalization: their integer rules in
  ONNX Runtime's int64 arithmetic (:mod:`npuforge.sim.lowered_int64`).
* Ops that only move codes (Reshape, Flatten, Transpose, MaxPool, Slice, Concat,
  Pad with its value translated, ...): the op itself; a Concat's constant input
  (a ViT's class token) as its codes.

Accumulators beyond float32's exact 2^24 (long reductions: a classifier's final
Gemm, ResNet's 3x3 convolutions over 256 channels) are held in float64 instead:
Gemm / MatMul run in double, Conv as ONNX Runtime's exact u8u8 ``ConvInteger``
(int32 sums of uint8 codes, cast to double); the requantization is then a
proven float64 formula.

A node the program runs in float lowers, when asked (``float_nodes``), to its float op
between a dequantization of its inputs and the quantizer's rounding of its output.

A node with no proven lowering raises
:class:`~npuforge.errors.UnsupportedError` naming it; :func:`make_simulator`
then uses the plain path. ONNX Runtime's ``ConvAddFusion`` and ``ConvMulFusion``
are switched off: they would fold the requantization's constants into the
integer weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from onnx import TensorProto

from ..errors import NpuforgeError, UnsupportedError
from ..export.onnx_export import _nodes_of
from ..ops.activation import FUSED_ATTRS
from ..quant.params import check_finite
from .float_exec import check_feeds
from .int_ops import NP_INT, exact_float_dtype, value_code
from ..quant.requant import multiplier_value
from .integer import IntegerSimulator, dequantize_output, quantize_input
from . import lowered_int64 as int64_rules
from .lowered_tables import TableLowerings
from .split import split_simulator
from .lowering_base import LoweringBuilder, channel_ranges, matmul_ranges, pointwise_conv
from .monotone_fit import Formula, fit

ENGINES = ("auto", "ort", "plain", "fast")
# ops that only move or select values: exact on the float copies q - zp (a max of
# shifted codes is the shifted max); Resize is here only as "passthrough", i.e. nearest
MOVERS = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Dropout", "MaxPool",
          "Slice", "Split", "Gather", "Pad", "Resize", "Expand", "Tile", "DepthToSpace", "SpaceToDepth",
          "ReverseSequence", "GatherElements", "GatherND", "GlobalMaxPool", "ReduceMax", "ReduceMin"}
# ORT's optimizers that would fold a constant Mul / Add after a Conv into its (integer) weights
DISABLED_OPTIMIZERS = ["ConvAddFusion", "ConvMulFusion"]
BYTE_CODES = ("uint8", "int8")  # activations whose codes MatMulInteger takes as bytes


def byte_offset(q) -> int:
    """What moves the values ``q - zp`` of 8-bit codes to bytes in [0, 255]: the zero point, 128
    more for int8 codes; the integer kernels' zero point for those bytes."""
    return int(q.zero_point) + (128 if q.dtype == "int8" else 0)


def requant_candidates(rounding: str, m: np.ndarray | None, scale: np.ndarray | None, shift: np.ndarray | None,
                       offset: np.ndarray, negative: bool, acc_dtype: type = np.float32) -> list[list[Formula]]:
    """Formulas to try for the requantization of ``acc + offset``, cheapest first; each
    inner list shares a structure (``offset``: the bias when the float kernel cannot
    hold it exactly, else 0).

    ``onnx``: ``round_half_even(float32(acc) * scale)``, the rule itself. ``single``:
    ``floor(acc * m + 1/2)``. ``fixedpoint``: gemmlowp's two roundings are
    ``floor(acc * m + 1/2 + 2^-(e+1))`` for positive results and, rounding half away
    from zero, ``-floor(|acc| * m + 1/2 + 2^-(e+1))`` for negative ones (e = max(-shift, 0):
    the rounding right shift's exponent; see :func:`~npuforge.sim.int_ops.requantize_fixedpoint`),
    so outputs that can be negative take the symmetric formula; with e = 0 (the
    quantizer's default form) it is one rounding, ties up, and the plain formula.
    float32 first where it can resolve every step; float64 (which holds m's 31 bits)
    otherwise or when float32 misses a step; float64 only for an accumulator held in
    float64 (``acc_dtype``)."""
    pre = offset.astype(np.float64) if np.any(offset) else None
    if rounding == "onnx":  # float32(acc + bias) * scale in float32, whatever the bias
        return [[Formula(np.asarray(scale, np.float32), rnd="round", pre=pre, acc_dtype=acc_dtype)]]
    # float32 can only resolve every step when its rounding of acc * m (about 2^-16 near
    # the top of a 255-step range) is far below one accumulator's worth of m; else skip it
    dtypes = (np.float32, np.float64) if acc_dtype is np.float32 and pre is None and 2.0**-16 < np.min(m) * 2.0**-6 \
        else (np.float64,)
    out = []
    for dtype in dtypes:
        r = m.astype(dtype)
        if rounding == "single":
            out.append([Formula(r, np.full(r.shape, 0.5, dtype), dtype=dtype, pre=pre, acc_dtype=acc_dtype)])
            continue
        e = np.maximum(-shift, 0)
        b = (0.5 + np.where(e > 0, 0.5 ** (e + 1), 0.0)).astype(dtype)
        # with no right shift there is one rounding, ties up on both sides: the plain formula
        forms = (False, True) if not negative or not np.any(e > 0) else (True, False)
        out += [[Formula(r, b, dtype=dtype, pre=pre, symmetric=symmetric, acc_dtype=acc_dtype)]
                for symmetric in forms[:1 + negative]]
    return out


def requant_rule(plain, node, prep: dict, lo: np.ndarray, hi: np.ndarray, offset: np.ndarray | None = None):
    """acc [C, J] (row c: channel c of ``prep``) -> the plain simulator's output codes of
    ``acc + offset``, zero point removed, clamped to [lo_c, hi_c]: the rule a lowering
    must equal."""
    zp = int(plain._q(node.outputs[0]).zero_point)

    def rule(acc: np.ndarray) -> np.ndarray:
        y = plain._requant(node, torch.from_numpy(acc if offset is None else acc + offset[:, None]), prep,
                           axis=0).numpy()
        return np.minimum(np.maximum(y + zp, lo[:, None] + zp), hi[:, None] + zp) - zp

    return rule


def channel_subset(prep: dict, channels: np.ndarray) -> dict:
    """``prep`` with its per-channel requantization constants restricted to ``channels``."""
    def pick(arr):
        arr = np.asarray(arr)
        return arr if arr.size == 1 else arr.reshape(-1)[channels]

    return {**prep, **{k: pick(prep[k]) for k in ("M", "S", "scale") if prep.get(k) is not None}}


def _truncates(f: Formula, reach: int | None) -> bool:
    """Whether the symmetric ``sign(x) floor(|x| r + b)`` may run as ``trunc(x r + sign(x) b)`` cast to
    int32: r and b not negative and ``|x| r + b`` below 2^31 wherever ``|x| <= reach``."""
    return reach is not None and f.rnd == "floor" and f.b is not None and bool((f.r >= 0).all()) and \
        bool((f.b >= 0).all()) and reach * float(f.r.max()) + float(f.b.max()) + 1 < 2**31


def proven_formula(plain, node, prep: dict, offset: np.ndarray, a, b, lo, hi,
                   acc_dtype: type = np.float32) -> Formula | None:
    """The cheapest float formula (:func:`requant_candidates`) proven equal to the node's
    requantization of ``acc + offset`` for every accumulator ``acc`` of [a_c - offset_c,
    b_c - offset_c], per channel of ``prep``; None if there is none."""
    channels = len(a)
    m = scale = shift = None
    if plain.rounding == "onnx":
        scale = np.broadcast_to(np.asarray(prep["scale"], np.float32), (channels,))
    else:
        m = np.broadcast_to(multiplier_value(prep["M"], prep["S"]), (channels,))
        shift = np.broadcast_to(prep["S"], (channels,))
    exact = requant_rule(plain, node, prep, lo, hi, offset)
    rounding = "single" if plain.rounding != "onnx" and "single_rounding" in node.quant else plain.rounding
    for group in requant_candidates(rounding, m, scale, shift, offset, negative=bool((lo < 0).any()),
                                    acc_dtype=acc_dtype):
        formula = fit(exact, group, a - offset, b - offset, lo, hi)
        if formula is not None:
            return formula
    return None


def matmul_rule(plain, node, aq, bq, yq) -> dict:
    """The requantization constants of a MatMul of two activations, as IntegerSimulator._matmul
    applies them (``onnx``: the float32 scale; else the fixed-point multiplier and shift)."""
    if plain.rounding == "onnx":
        return {"scale": (np.float32(aq.scale) * np.float32(bq.scale)).astype(np.float32) / np.float32(yq.scale)}
    return {"R": plain._R, "fits_int32": False, "M": plain._int(node, "multiplier").astype(np.int64)[:1],
            "S": plain._int(node, "shift").astype(np.int64)[:1]}


def uint8_weights(w: np.ndarray) -> np.ndarray:
    """int8 weight codes as uint8 ``w + 128`` (zero point 128): ONNX Runtime's u8u8 integer
    convolutions, exact on every CPU, compute the same accumulator on them."""
    return (np.asarray(w).astype(np.int16) + 128).astype(np.uint8)


class _Builder(TableLowerings, LoweringBuilder):
    """Builds the ONNX graph node by node; names are the IR's (values hold ``q - zp``)."""

    ELEM_TYPE, SUFFIX = TensorProto.FLOAT, "integer"

    def activation(self, node, name: str):
        """The quantized activation ``name`` (not a constant, one zero point) or a refusal."""
        v = self.graph.values[name]
        p = v.quant
        if v.is_const or p is None:
            self.refuse(node, f"input '{name}' is a constant or not quantized")
        if p.per_channel:
            self.refuse(node, f"'{name}' has per-channel activation parameters")
        return p

    def check_inputs(self) -> None:
        for name in self.graph.inputs:
            v = self.graph.values[name]
            if v.quant is None and not self.is_index(name) and v.dtype != "float32":
                self.refuse(None, f"graph input '{name}' is {v.dtype} and not quantized")

    # -- kept in float ---------------------------------------------------------------------
    def _float_node(self, node):
        """A node the integer program runs in float, as the plain path does: its quantized inputs
        dequantized (``c * s``: float32 ``(q - zp) * s``), the op itself in float32, a quantized
        output rounded to its grid (``clip(rint(y / s), qmin - zp, qmax - zp)``: the quantizer's
        float32 division). Equal to the plain path up to the float kernel's summation order,
        which the plain path's own float kernels vary with the CPU (no integer rule to prove)."""
        g = self.graph
        renames = {}
        for name in node.inputs:
            if not name:
                continue
            v = g.values[name]
            if v.is_const:
                self.const(name, np.asarray(v.data))
            elif v.quant is not None:
                p = self.activation(node, name)
                renames[name] = f"{name}::deq"
                if renames[name] not in self._made:  # once per value, whoever else reads it in float
                    self._made.add(renames[name])
                    self.emit("Mul", [name, self.const(f"{name}::scale", np.float32(p.scale))], renames[name])
        quantized = {y for y in node.outputs if y and g.values[y].quant is not None}
        for y in quantized:
            self.activation(node, y)
        self.float_op(node, renames, quantized)
        for y in quantized:
            p = g.values[y].quant
            zp = int(p.zero_point)
            ratio = self.emit("Div", [f"{y}::float", self.const(f"{y}::scale", np.float32(p.scale))], f"{y}::ratio")
            rounded = self.emit("Round", [ratio], f"{y}::rint")
            self.emit("Clip", [rounded, self.const(f"{y}::lo", np.float32(p.qmin - zp)),
                               self.const(f"{y}::hi", np.float32(p.qmax - zp))], y)
        self.report[node.name] = "in float (kept in float by the quantizer)"

    # -- compute ---------------------------------------------------------------------------
    def _compute(self, node):
        plain = self.plain
        prep = plain._prep_compute(node)
        xq = self.activation(node, node.inputs[0])
        self.activation(node, node.outputs[0])
        if node.op not in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            self.refuse(node, "no lowering for this compute node")
        wide = prep["ftype"] is not torch.float32  # accumulators beyond float32's exact 2^24
        if wide and prep["ftype"] is not torch.float64:
            self.refuse(node, f"accumulators up to {prep['bound']} are beyond float64's exact 2^53")
        if wide and node.op == "ConvTranspose":  # ONNX Runtime has it in float32 only
            self.refuse(node, f"accumulators up to {prep['bound']} are beyond float32's exact 2^24")
        channels = len(prep["rows"])
        fold = prep["fold_bias"] and not (wide and node.op == "Conv")  # ConvInteger takes no bias
        bias = prep["bias"] if fold else None  # else in the requantization formula, as offset
        offset = np.zeros(channels, np.int64) if prep["bias"] is None or fold \
            else np.broadcast_to(prep["bias"], (channels,)).astype(np.int64)
        attrs = {k: v for k, v in node.attrs.items() if k not in FUSED_ATTRS and v is not None and v != []}
        acc = self._accumulator(node, prep, bias, attrs, wide, xq)
        if wide and plain.rounding == "onnx" and not offset.any():
            # ONNX's rule starts from float32(acc + bias): that rounding is the rule's own
            acc, wide = self.emit("Cast", [acc], f"{node.name}::acc32", to=TensorProto.FLOAT), False
        a, b, lo_c, hi_c = channel_ranges(plain, node)  # bias included
        shape = [-1] + [1] * (len(self.graph.values[node.outputs[0]].shape) - 2) \
            if node.op in ("Conv", "ConvTranspose") else [-1]
        acc_dtype = np.float64 if wide else np.float32
        if node.attrs.get("activation") == "LeakyRelu":
            self.report[node.name] = self._leaky(node, prep, acc, offset, a, b, lo_c, hi_c, shape, acc_dtype)
            return
        self.report[node.name] = self._requantize(node, prep, acc, offset, a, b, lo_c, hi_c, shape, acc_dtype)

    def _requantize(self, node, prep, acc: str, offset, a, b, lo_c, hi_c, shape, acc_dtype, part=None) -> str:
        """The requantization of ``acc + offset`` into the node's output (``part``'s, a copy of the
        node that names part of its output, if given): the cheapest float formula proven equal to
        it, else the fixed-point steps themselves in int64."""
        formula = proven_formula(self.plain, node, prep, offset, a, b, lo_c, hi_c, acc_dtype)
        part = part or node
        if formula is not None:
            return self._formula(part, formula, acc, lo_c, hi_c, shape, acc_double=acc_dtype is np.float64,
                                 reach=int(max(np.abs(a).max(), np.abs(b).max())))
        if self.plain.rounding == "onnx":
            self.refuse(node, "no float formula proven equal to its requantization")
        channels = len(a)
        pre = f"{part.name}::rq"
        acc64 = self.emit("Cast", [acc], f"{pre}::acc64i", to=TensorProto.INT64)
        if offset.any():
            acc64 = self.emit("Add", [acc64, self.const(f"{pre}::offset", offset.astype(np.int64).reshape(shape))],
                              f"{pre}::biased64")
        single = self.plain.rounding == "single" or "single_rounding" in node.quant
        q64 = int64_rules.requantize(self, acc64, np.broadcast_to(prep["M"], (channels,)),
                                     np.broadcast_to(prep["S"], (channels,)), single, shape, pre)
        self._clamp(part, self.emit("Cast", [q64], f"{pre}::q32", to=TensorProto.FLOAT), lo_c, hi_c, shape)
        return "int64 fixed-point (no float formula proven)"

    def _leaky(self, node, prep, acc, offset, a, b, lo_c, hi_c, shape, acc_dtype) -> str:
        """A fused LeakyRelu: negative accumulators (bias included) take the derived
        multiplier for alpha * m. Each side gets its own formula, proven on its part of
        the channel's range, and ``Where(acc + bias < 0)`` picks."""
        negative = {**prep, "M": prep.get("Mneg"), "S": prep.get("Sneg"), "scale": prep.get("scale_neg")}
        sides = {"pos": (prep, np.maximum(a, 0), np.maximum(b, 0)), "neg": (negative, np.minimum(a, -1),
                                                                         np.minimum(b, -1))}
        outs, how = {}, []
        for side, (p, lo_acc, hi_acc) in sides.items():
            part = dataclasses.replace(node, name=f"{node.name}::{side}", outputs=[f"{node.outputs[0]}::{side}"])
            how.append(self._requantize(node, p, acc, offset, lo_acc, hi_acc, lo_c, hi_c, shape, acc_dtype, part))
            outs[side] = part.outputs[0]
        threshold = self.const(f"{node.name}::negative_below", (-offset).astype(acc_dtype).reshape(shape))
        below = self.emit("Less", [acc, threshold], f"{node.name}::negative")
        self.emit("Where", [below, outs["neg"], outs["pos"]], node.outputs[0])
        return "LeakyRelu: " + " / ".join(how)

    def _accumulator(self, node, prep, bias, attrs, wide: bool, xq) -> str:
        """The exact accumulator: in float32 (every sum below 2^24), or in float64 for
        sums beyond that (below 2^53), where Gemm / MatMul run on float64 copies (ONNX
        Runtime has them in double) and Conv on ONNX Runtime's exact integer kernels
        (:meth:`_conv_integer`), a grouped one of int16 input as float32 Convs of its bytes
        (:meth:`_conv_by_bytes`)."""
        if wide and node.op == "Conv":
            grouped = node.attrs.get("group", 1) > 1  # ConvInteger runs one GEMM per group: slow there
            if grouped and self._int16_fits(xq) and exact_float_dtype(int(prep["rows"].max(initial=0)) * 255) \
                    is torch.float32:
                return self._conv_by_bytes(node, prep, attrs)
            return self._conv_integer(node, prep, xq, attrs)
        dtype, suffix = (np.float64, "64") if wide else (np.float32, "")
        x = node.inputs[0]
        if wide:
            x = self.emit("Cast", [x], f"{node.name}::x64", to=TensorProto.DOUBLE)
        w = self.const(f"{node.name}::w{suffix}", prep["w"].astype(dtype))
        b = [self.const(f"{node.name}::b{suffix}", bias.astype(dtype))] if bias is not None else []
        acc = f"{node.name}::acc{suffix}"
        if node.op != "MatMul":
            return self.emit(node.op, [x, w] + b, acc, **attrs)
        product = self.emit("MatMul", [x, w], acc if not b else acc + "0")
        return self.emit("Add", [product] + b, acc) if b else product

    @staticmethod
    def _int16_fits(xq) -> bool:
        """Whether ``q - zp`` of the int16 activation ``xq`` fits int16 (splits into two bytes)."""
        zp = int(xq.zero_point)
        return xq.dtype == "int16" and xq.qmin - zp >= -32768 and xq.qmax - zp <= 32767

    def _conv_by_bytes(self, node, prep, attrs) -> str:
        """The exact accumulators of a Conv of an int16 input c = q - zp, beyond float32's 2^24, as
        two float32 convolutions: c = 256 h + l (l in [0, 255], h in [-128, 127]); sum w l and
        sum (256 w) h have every partial sum an integer (times 256) below 2^24 where the channel's
        sum of |w| times 255 is, so both are exact; their sum in float64. For grouped convolutions:
        ONNX Runtime's ConvInteger runs one GEMM per group (ese_vovnet's depthwise 3x3 on
        [1, 160, 20, 20]: 723 us as two ConvInteger, 66 as two float Conv); a 1x1 of 736 to 512
        channels took 1.0 ms per ConvInteger and 1.5 per float Conv."""
        pre = node.name
        low, high = self._int16_float_bytes(node.inputs[0])
        w = prep["w"].astype(np.float32)
        parts = [self.emit("Cast", [self.emit("Conv", [v, self.const(f"{pre}::w{tag}", w * k)], f"{pre}::acc{tag}",
                                              **attrs)], f"{pre}::acc64{tag}", to=TensorProto.DOUBLE)
                 for v, k, tag in ((low, 1, "_low"), (high, 256, "_high256"))]
        return self.emit("Add", parts, f"{pre}::acc64")

    def _int16_float_bytes(self, x: str) -> tuple[str, str]:
        """``x`` (int16 ``c = q - zp`` in float32) as (l, h), c = 256 h + l, in float32 (once per value)."""
        out = (f"{x}::low_f", f"{x}::high_f")
        if out[0] not in self._made:
            self._made.add(out[0])
            high = self.emit("Floor", [self.emit("Mul", [x, self.const("float32_1_256", np.float32(1 / 256))],
                                                 f"{x}::c_256")], out[1])
            self.emit("Sub", [x, self.emit("Mul", [high, self.const("float32_256", np.float32(256))], f"{x}::h256")],
                      out[0])
        return out

    def _conv_integer(self, node, prep, xq, attrs) -> str:
        """The exact accumulators of a Conv beyond float32's 2^24, in float64, on ONNX Runtime's
        integer kernels (int32 sums; zero padding is the zero point): a pointwise one as
        ``MatMulInteger`` of its weights [C_out, C_in] by the input [N, C_in, H W] (u8s8 where ONNX
        Runtime sums those exactly, 2.5x its u8u8 ``ConvInteger`` on a 448-to-256 1x1 over 40 x 40),
        any other as u8u8 ``ConvInteger``. The codes go in as bytes: uint8 ones as they are, int8
        ones moved up by 128, an int16 input c = q - zp split, c = 256 h + l (l in [0, 255], h
        int8), one product each: sum w c = 256 sum w h + sum w l, each part within int32."""
        from .qoperator import signed_weights_exact

        x, pre = node.inputs[0], node.name
        zp = int(xq.zero_point)
        if xq.dtype in BYTE_CODES:
            if not prep["fits_int32"]:
                self.refuse(node, f"accumulators up to {prep['bound']} are beyond int32")
            parts = [(x, byte_offset(xq), 1, "")]  # (values, code offset, weight, tag)
        elif self._int16_fits(xq):
            low, high = self._int16_float_bytes(x)
            parts = [(low, 0, 1, "_low"), (high, 128, 256, "_high")]
        else:
            self.refuse(node, f"accumulators up to {prep['bound']} are beyond float32's exact 2^24 and its input "
                              f"is {xq.dtype} (zero point {zp})")
        out_shape = self.graph.values[node.outputs[0]].shape
        pointwise = pointwise_conv(prep["w"].shape, attrs) and all(isinstance(d, int) for d in out_shape[1:])
        signed = pointwise and signed_weights_exact()
        w = self.const(f"{pre}::w_u8", uint8_weights(prep["w"][:, :, 0, 0] if pointwise else prep["w"]))
        w_zp = self.const("w_zp128", np.uint8(128))
        sums = []
        for v, offset, k, tag in parts:
            offset -= 128 if signed else 0  # int8 codes: in [-128, 127]
            codes = self._codes(v, offset, signed)
            code_zp = self.const(f"zp_{'s8' if signed else 'u8'}_{offset}", (np.int8 if signed else np.uint8)(offset))
            if pointwise:
                rows = self.emit("Reshape", [codes, self.const("keep_2_flatten", np.array([0, 0, -1], np.int64))],
                                 f"{pre}::x_rows{tag}")
                acc = self.emit("Reshape", [self.emit("MatMulInteger", [w, rows, w_zp, code_zp], f"{pre}::acc32{tag}"),
                                            self.const(f"{pre}::out_shape", np.array([0, *out_shape[1:]], np.int64))],
                                f"{pre}::acc32{tag}_4d")
            else:
                acc = self.emit("ConvInteger", [codes, w, code_zp, w_zp], f"{pre}::acc32{tag}", **attrs)
            acc = self.emit("Cast", [acc], f"{pre}::acc64{tag}", to=TensorProto.DOUBLE)
            sums.append(acc if k == 1 else self.emit("Mul", [acc, self.const(f"float64_{k}", np.float64(k))],
                                                     f"{pre}::acc64{tag}{k}"))
        return sums[0] if len(sums) == 1 else self.emit("Add", sums, f"{pre}::acc64")

    def _codes(self, x: str, offset: int, signed: bool = False) -> str:
        """``x`` (float32 values) plus ``offset``, as uint8 (int8 if ``signed``), made once per value."""
        out = f"{x}::{'s8' if signed else 'u8'}{offset:+d}"
        if out not in self._made:
            self._made.add(out)
            codes = self.emit("Add", [x, self.const(f"float32_{offset}", np.float32(offset))], f"{out}_f") \
                if offset else x
            self.emit("Cast", [codes], out, to=TensorProto.INT8 if signed else TensorProto.UINT8)
        return out

    def _formula(self, node, f: Formula, acc: str, lo_c, hi_c, shape, acc_double: bool = False,
                 reach: int | None = None) -> str:
        """Emit ``f`` on ``acc`` (float32, or float64 with ``acc_double``, which takes a
        float64 formula) into the node's output; ``reach``: a bound on ``|acc + pre|``, where
        known; -> a one-line description."""
        pre = f"{node.name}::rq"
        k = lambda tag, arr: self.const(f"{pre}::{tag}", np.asarray(arr).reshape(shape))  # noqa: E731
        wide = f.dtype == np.float64
        x = acc
        if f.pre is not None:  # exact in float64, then rounded to float32 as an int32 -> float cast is
            exact = self.exact_int.get(acc, acc)  # an int32 sum's own Cast to float64 where it has one
            x = self.emit("Add", [self.emit("Cast", [exact], f"{pre}::acc64", to=TensorProto.DOUBLE), k("pre", f.pre)],
                          f"{pre}::biased")
            if not wide:
                x = self.emit("Cast", [x], f"{pre}::biased32", to=TensorProto.FLOAT)
        if wide and f.symmetric and _truncates(f, reach):
            # sign(x) floor(|x| r + b) = trunc(x r + sign(x) b): IEEE rounding is symmetric, so x r + sign(x) b
            # is exactly sign(x) (|x| r + b), which floors as it truncates (r, b >= 0); ONNX's Cast to int32
            # truncates, exactly below 2^31. Six passes where Abs, Floor and the product by the sign took eight
            if f.pre is None and not acc_double:
                x = self.emit("Cast", [self.exact_int.get(x, x)], f"{pre}::x64", to=TensorProto.DOUBLE)
            sign = self.emit("Sign", [x], f"{pre}::sign")
            z = self.emit("Add", [self.emit("Mul", [x, k("r", f.r)], f"{pre}::v"),
                                  self.emit("Mul", [sign, k("b", f.b)], f"{pre}::sb")], f"{pre}::vb")
            t = self.emit("Cast", [self.emit("Cast", [z], f"{pre}::t", to=TensorProto.INT32)], f"{pre}::t32",
                          to=TensorProto.FLOAT)
            self._clamp(node, t, lo_c, hi_c, shape)
            return f"float64 {f.rnd} symmetric"
        sign = self.emit("Sign", [x], f"{pre}::sign") if f.symmetric else None
        v = self.emit("Abs", [x], f"{pre}::abs") if f.symmetric else x
        if wide and f.pre is None:  # with pre, x is float64 already
            v = self.emit("Cast", [v], f"{pre}::x64", to=TensorProto.DOUBLE)
        v = self.emit("Mul", [v, k("r", f.r)], f"{pre}::v")
        vb = v if f.b is None else self.emit("Add", [v, k("b", f.b)], f"{pre}::vb")
        t = self.emit("Round" if f.rnd == "round" else "Floor", [vb], f"{pre}::t")
        if wide:  # integers; any beyond float32's exact range are beyond the clamp too (rounding is monotone)
            t = self.emit("Cast", [t], f"{pre}::t32", to=TensorProto.FLOAT)
        if sign is not None:
            if wide and (f.pre is not None or acc_double):  # the sign of a float64 x
                sign = self.emit("Cast", [sign], f"{pre}::sign32", to=TensorProto.FLOAT)
            t = self.emit("Mul", [t, sign], f"{pre}::signed")
        self._clamp(node, t, lo_c, hi_c, shape)
        return f"{'float64' if wide else 'float32'} {f.rnd}{' symmetric' if f.symmetric else ''}"

    def _clamp(self, node, t: str, lo_c, hi_c, shape):
        out = node.outputs[0]
        if (lo_c == lo_c[0]).all() and (hi_c == hi_c[0]).all():
            self.emit("Clip", [t, self.const(f"{out}::lo", np.float32(lo_c[0])),
                               self.const(f"{out}::hi", np.float32(hi_c[0]))], out)
        else:
            low = self.emit("Max", [t, self.const(f"{out}::lo", lo_c.astype(np.float32).reshape(shape))],
                            f"{out}::low")
            self.emit("Min", [low, self.const(f"{out}::hi", hi_c.astype(np.float32).reshape(shape))], out)

    def _matmul(self, node):
        """MatMul of two activations (attention's Q K^T and its weights times V): the codes'
        product, exact in float32 or float64 by the bound K * max|a| * max|b|, then one
        per-tensor requantization formula proven on [-bound, bound]."""
        plain = self.plain
        aq, bq = (self.activation(node, name) for name in node.inputs[:2])
        yq = self.activation(node, node.outputs[0])
        ranges = matmul_ranges(plain, node)  # (-bound, bound, lo, hi)
        if ranges is None:
            self.refuse(node, f"its inner dimension {self.graph.values[node.inputs[0]].shape[-1]!r} is not static")
        bound = int(ranges[1][0])
        ftype = exact_float_dtype(bound)
        if ftype is None:
            self.refuse(node, f"accumulators up to {bound} are beyond float64's exact 2^53")
        wide = ftype is torch.float64
        a, b = node.inputs[:2]
        if wide and bound < 1 << 31 and aq.dtype in BYTE_CODES and bq.dtype in BYTE_CODES:
            # long rows (attention over many tokens): exact int32 sums on ONNX Runtime's u8u8 MatMulInteger of
            # the codes as bytes, not two float64 copies and a float64 MatMul (pit_ti's 730-token attention)
            offsets = [byte_offset(q) for q in (aq, bq)]
            acc = self.emit("MatMulInteger", [self._codes(a, offsets[0]), self._codes(b, offsets[1]),
                                              *(self.const(f"zp_u8_{o}", np.uint8(o)) for o in offsets)],
                            f"{node.name}::acc_i32")
            acc, product = self.emit("Cast", [acc], f"{node.name}::acc64", to=TensorProto.DOUBLE), "int32"
        else:
            if wide:
                a, b = (self.emit("Cast", [v], f"{node.name}::{v}64", to=TensorProto.DOUBLE) for v in (a, b))
            acc = self.emit("MatMul", [a, b], f"{node.name}::acc{'64' if wide else ''}")
            product = "float64" if wide else "float32"
        if wide and plain.rounding == "onnx":  # ONNX's rule starts from float32(acc): that rounding is its own
            acc, wide = self.emit("Cast", [acc], f"{node.name}::acc32", to=TensorProto.FLOAT), False
        prep = matmul_rule(plain, node, aq, bq, yq)
        lo_c, hi_c = ranges[2:]
        acc_dtype = np.float64 if wide else np.float32
        formula = proven_formula(plain, node, prep, np.zeros(1, np.int64), *ranges, acc_dtype)
        if formula is None:
            self.refuse(node, "no float formula proven equal to its requantization")
        how = self._formula(node, formula, acc, lo_c, hi_c, [-1], acc_double=wide, reach=bound)
        self.report[node.name] = f"matmul of activations, {product} product, {how}"

    def _softmax(self, node):
        self.report[node.name] = int64_rules.softmax(self, node)

    def _layernorm(self, node):
        self.report[node.name] = int64_rules.layernorm(self, node)

    def _interpolate(self, node):
        self.report[node.name] = int64_rules.interpolate(self, node)

    # -- moving codes ----------------------------------------------------------------------
    def _passthrough(self, node):
        if node.op not in MOVERS or len([o for o in node.outputs if o]) > 1 and node.op != "Split":
            self.refuse(node, "no lowering for this op")
        g = self.graph
        if node.op == "Gather" and g.values[node.inputs[0]].is_const and self.is_index(node.inputs[1]):
            return self._lookup(node)
        xq = self.activation(node, node.inputs[0])
        inputs = list(node.inputs)
        for k, name in enumerate(inputs[1:], 1):
            if name and not g.values[name].is_const:
                self.refuse(node, f"input '{name}' is computed")
            if not name:
                continue
            if node.op == "Pad" and k == 2:  # the pad value, as a code without its zero point
                value = float(np.asarray(g.values[name].data).reshape(-1)[0])
                inputs[k] = self.const(f"{node.name}::value",
                                       np.float32(value_code(value, xq) - int(xq.zero_point)))
            else:
                self.const(f"{node.name}::{k}", np.asarray(g.values[name].data))
                inputs[k] = f"{node.name}::{k}"
        if node.op == "Dropout":
            self.emit("Identity", [inputs[0]], node.outputs[0])
        else:
            moved = dataclasses.replace(node, inputs=inputs)
            self.nodes.extend(_nodes_of(g, moved))
        self.report[node.name] = "moves codes"

    def _lookup(self, node):
        """Gather of a quantized constant (an embedding table) by integer ids: the table's codes."""
        yq = self.activation(node, node.outputs[0])
        codes = self.plain._get(node.inputs[0], {}).numpy().astype(np.int64)
        table = self.const(f"{node.name}::codes", (codes - yq.zero_point.astype(np.int64)).astype(np.float32))
        self.emit("Gather", [table, node.inputs[1]], node.outputs[0], axis=node.attrs.get("axis", 0))
        self.report[node.name] = "lookup of a constant's codes"

    def _concat(self, node):
        yq = self.activation(node, node.outputs[0])
        for name in node.inputs:
            v = self.graph.values[name]
            if v.is_const and v.quant is not None:  # a ViT's class token: its codes, as the plain path reads them
                if not v.quant.same_as(yq):
                    self.refuse(node, f"constant input '{name}' does not share the output's parameters")
                codes = self.plain._get(name, {}).numpy().astype(np.int64)
                self.const(name, (codes - yq.zero_point.astype(np.int64)).astype(np.float32))
            elif not self.activation(node, name).same_as(yq):
                self.refuse(node, f"input '{name}' does not share the output's parameters")
        self.nodes.extend(_nodes_of(self.graph, node))
        self.report[node.name] = "moves codes"


class LoweredSimulator:
    """``LoweredSimulator(graph, rounding).run(feeds)``: the same results as
    :class:`~npuforge.sim.integer.IntegerSimulator`, bit for bit, computed by one ONNX
    Runtime session. With uint8 activations the graph is ONNX Runtime's own
    integer operators (:mod:`npuforge.sim.qoperator`, ``form`` "qoperator"), the
    nodes they cannot compute exactly lowered as below in between; otherwise the
    float lowering above (``form`` "float"). Each node's requantization is proven
    when it is built. Raises UnsupportedError naming the first node neither can
    lower. ``form`` (argument) asks for one of the two; ``lowering`` maps each node
    to how it runs. ``float_nodes``: nodes the program runs in float (kept in float by
    the quantizer) run in ONNX Runtime's float kernels instead of being refused; their
    results then equal the plain path's up to the float kernels' summation order (which
    the plain path's own torch kernels vary with the CPU), a code now and then at a
    rounding boundary, so only evaluations that compare top-1 (``analyze``) ask for it."""

    def __init__(self, graph, rounding: str = "fixedpoint", threads: int | None = None, form: str | None = None,
                 float_nodes: bool = False):
        import onnxruntime as ort

        from .qoperator import QOperatorBuilder

        self.plain = IntegerSimulator(graph, rounding)
        self.graph, self.rounding = graph, rounding
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # a node kept in float runs between DequantizeLinear and QuantizeLinear, which ONNX Runtime's QDQ
        # optimizers would fuse into an int8 kernel or, between two such nodes, drop with their rounding
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        forms = {"qoperator": QOperatorBuilder, "float": _Builder}
        refusals = []
        for self.form in [form] if form else list(forms):
            try:
                builder = forms[self.form](self.plain, float_nodes)
                self.model = builder.build()
                self.session = _session(self.model, options)
                break
            except UnsupportedError as e:
                refusals.append(e)
                if self.form == (form or "float"):  # the last form to try: the refusal that came furthest
                    raise max(reversed(refusals), key=lambda r: getattr(r, "node_index", -1)) from None
        self.lowering = builder.report
        self._quantizers: dict = {}  # input -> ONNX Runtime session quantizing it

    def run(self, feeds: dict, outputs: list[str] | None = None, dequantize: bool = True) -> dict:
        g = self.graph
        wanted = list(outputs or g.outputs)
        if any(name not in g.outputs for name in wanted):
            return self.plain.run(feeds, outputs, dequantize)  # ORT returns graph outputs only
        codes, floats = {}, {}
        for name, arr in feeds.items():
            p = g.values[name].quant if name in g.values else None
            arr = np.asarray(arr)
            (codes if p is not None and arr.dtype == NP_INT[p.dtype] else floats)[name] = arr
        checked = check_feeds(g, {**floats, **{n: np.zeros(a.shape, np.float32) for n, a in codes.items()}})
        ort_feeds = {}
        for name in g.inputs:
            p = g.values[name].quant
            if p is None:  # token ids and the like, as given
                ort_feeds[name] = checked[name].numpy()
                continue
            if name not in codes:
                check_finite(checked[name], f"input '{name}'", "the integer simulator")
            q = codes[name] if name in codes else self._quantize(name, checked[name].numpy(), p)
            ort_feeds[name] = q if self.form == "qoperator" else q.astype(np.float32) - np.float32(int(p.zero_point))
        got = self.session.run(wanted, ort_feeds)
        result = {}
        for name, y in zip(wanted, got):
            p = g.values[name].quant
            if p is None:  # an integer output (index arithmetic), as computed
                result[name] = y
                continue
            q = y if self.form == "qoperator" else (y + np.float32(int(p.zero_point))).astype(NP_INT[p.dtype])
            result[name] = dequantize_output(q, p) if dequantize else q
        return result

    def _quantize(self, name: str, x: np.ndarray, p) -> np.ndarray:
        """Float input -> codes: ONNX Runtime's QuantizeLinear for a per-tensor 8-bit input (MLAS divides
        by the scale in float32, clamps, rounds half to even and adds the zero point: the numbers of
        :func:`quantize_input`, several times faster on a batch of images), else quantize_input."""
        if p.per_channel or p.dtype not in ("uint8", "int8") or x.dtype != np.float32:
            return quantize_input(x, p)
        if name not in self._quantizers:
            import onnxruntime as ort
            from onnx import helper, numpy_helper

            params = [numpy_helper.from_array(np.float32(p.scale), "scale"),
                      numpy_helper.from_array(np.asarray(int(p.zero_point), NP_INT[p.dtype]), "zp")]
            graph = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"])], "quantize",
                                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                      [helper.make_tensor_value_info("q", params[1].data_type, None)], params)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
            model.ir_version = 8
            options = ort.SessionOptions()  # one thread: a second pool's spinning threads would slow the main one
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            options.log_severity_level = 3
            self._quantizers[name] = _session(model, options)
        return self._quantizers[name].run(None, {"x": x})[0]


def _session(model, options):
    """ONNX Runtime's session of a lowered graph; a graph it refuses (its shape inference, a kernel it
    lacks) is an UnsupportedError, so the next form or the plain simulator takes over."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=DISABLED_OPTIMIZERS)
    except Exception as e:  # ONNX Runtime raises its own exception types
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise UnsupportedError(f"ONNX Runtime cannot load the lowered graph ({first})") from None


def make_simulator(graph, rounding: str = "fixedpoint", engine: str = "auto"):
    """The integer simulator for ``graph``: ``ort`` the lowered ONNX Runtime path (an
    error if some node cannot be lowered), ``plain`` the reference torch path,
    ``auto`` the first where every node lowers, else the two split at the first node that does
    not (:class:`~npuforge.sim.split.SplitSimulator`: lowered before it, plain from it on; its
    ``plain_from`` says where and why), else the plain path; ``fast`` as auto, with the
    nodes kept in float lowered too (ONNX Runtime's float kernels: equal to the plain path
    up to float summation order there, see :class:`LoweredSimulator`). A plain simulator
    that auto or fast fell back to says why in ``fallback``."""
    if engine not in ENGINES:
        raise NpuforgeError(f"engine '{engine}' is not one of {', '.join(ENGINES)}")
    if engine == "plain":
        return IntegerSimulator(graph, rounding)
    try:
        return LoweredSimulator(graph, rounding, float_nodes=engine == "fast")
    except UnsupportedError as e:
        if engine == "ort":
            raise UnsupportedError(f"{e}; the plain simulator runs it (--sim-engine plain or auto)") from None
        split = split_simulator(graph, rounding, engine == "fast", e)
        if split is not None:
            return split
        sim = IntegerSimulator(graph, rounding)
        sim.fallback = str(e)
        return sim


__all__ = ["LoweredSimulator", "make_simulator", "ENGINES"]
