"""The integer simulator: what an int8 NPU computes, bit for bit.

It runs a quantized IR with integer tensors (the codes of int8 / uint8 / int16
values), int32 accumulators, the requantization multipliers and shifts the
quantizer stored, saturation, table lookups, integer average pooling with
rounded division, integer add / mul with rescaling, and concatenation of
values that share parameters. It reads only the integers stored on the nodes
(``Node.quant``: weight, bias, multiplier, shift, lut, input{k}) and the zero
points / dtypes of the values' ``QParams`` -- it never re-derives them from
float scales, except in the ``onnx`` rounding mode, which by definition uses
the float scales as the ONNX QLinear operators do.

Rounding modes
--------------
``fixedpoint`` (the NPU default): gemmlowp / TFLite requantization,
    ``SaturatingRoundingDoublingHighMul`` then ``RoundingDivideByPOT``
    (:func:`npuforge.sim.int_ops.requantize_fixedpoint`).
``single``: single-rounding fixed point (TFLite's ``TFLITE_SINGLE_ROUNDING``,
    CMSIS-NN's single-rounding option): ``floor((acc * M + 2^(30-shift)) / 2^(31-shift))``,
    the same stored integers with one rounding instead of two
    (:func:`npuforge.sim.int_ops.requantize_single`).
``onnx``: ``saturate(round_half_even(float32(acc) * scale) + zero_point)`` with
    the float32 scale computed as ONNX Runtime computes it (e.g.
    ``(s_x * s_w) / s_y`` for QLinearConv), and each op's ONNX Runtime formula
    (QLinearAdd, QLinearMul, QLinearAveragePool, QLinearGlobalAveragePool,
    tables rebuilt from the float scales for the lookup ops).

Per kind, in ``fixedpoint`` mode (R(v; M, s) is the requantization above;
``x' = x - zp_x``):

* compute (Conv, ConvTranspose, Gemm, MatMul with constant weight):
  ``acc = bias + sum w * x'`` (int32), ``y = clamp(zp_y + R(acc; M_c, s_c), lo, hi)``;
  a fused Relu / Clip only tightens the saturation bounds lo, hi in the
  output's integer domain (Relu: lo = zp_y; Clip(a, b): lo, hi = zp_y +
  round(a / s_y), zp_y + round(b / s_y) -- these two bounds are derived from
  the float attribute and scale: the quantizer stores no integers for them).
  A fused LeakyRelu(alpha) requantizes negative accumulators with a second
  multiplier, ``quantize_multiplier(alpha * m)`` (also derived; see the docs).
  Quantized with TFLite's multipliers, a Gemm / MatMul (TFLite's FULLY_CONNECTED) stores
  ``single_rounding``: R rounds once, as LiteRT's reference FULLY_CONNECTED does.
* matmul (two activations): ``acc = sum a' * b'``, requantized likewise.
* Add / Sub: each operand rescaled to the output with L extra fractional bits,
  ``t_i = R(x_i' * 2^L; M_i, s_i)``, ``y = zp_y + RoundingDivideByPOT(t_0 +- t_1, L)``,
  with L = min(20, the most that keeps every shifted operand below 2^30) -- a
  pure function of the stored shifts and the operands' zero points and dtypes.
  Quantized with TFLite's multipliers, TFLite's ADD: ``t_i = R(x_i' * 2^20; M_i, s_i)``
  with M_i ~ s_i / (2 max(s_0, s_1)), ``y = zp_y + R(t_0 +- t_1; M_out, s_out)``
  (stored: left_shift, multiplier{0,1,out}, shift{0,1,out}).
* Mul: ``y = zp_y + R(a' * b'; M, s)``.
* AveragePool / GlobalAveragePool / ReduceMean: window sums of x' (int32),
  ``t = R(sum * 2^L; M, s)`` (M, s encode s_x / s_y), then
  ``y = zp_y + round_half_away(t / (count * 2^L))`` -- one rounded division by
  the window's element count (ONNX's count_include_pad rule), L as above, or
  the stored ``extra_bits`` and ``divisor`` (TFLite's MEAN: 0 bits, the count folded
  into the multiplier, divisor 1). TFLite's AVERAGE_POOL_2D (``code_average``, input and
  output on one grid): ``round_half_away(sum of codes / count)`` -- rounding the codes,
  zero point included, is not rounding ``x - zp`` and adding it back.
* lut: ``y = lut[x - qmin]``.
* nms: NonMaxSuppression on the codes of its boxes and scores, int64 indices out
  (quant/nms_rule.py: exact integer areas, the IoU threshold on a 2^-16 grid).
* prelu: ``zp_y + R(x'; M_1, s_1)`` where ``x' >= 0``, ``zp_y + R(x' a'; M_2, s_2)`` elsewhere, a' the
  int8 slope's codes less their zero point, M_2 per channel (quant/prelu_rule.py).
* minmax (Max / Min of activations, Clip with a computed bound): every operand requantized to the
  output grid, ``zp_y + R(x_k'; M_k, s_k)``, then their maximum / minimum (quant/minmax_rule.py).
* passthrough / concat: the op moves codes; parameters are shared.

NaN or an infinity in a float graph input, or in a value a node kept in float computes, is an
NpuforgeError naming the node and the value (a cast would make it an arbitrary code).

Graph inputs given as float arrays are quantized with the input value's
parameters (``round_half_even(x / s) + zp``, saturated); integer arrays of the
input's quantized dtype are taken as codes. Outputs are dequantized to float32
(``(q - zp) * s``) unless ``dequantize=False``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ModelFormatError, NpuforgeError, UnsupportedError
from ..ops.registry import get_op
from ..quant.params import check_finite
from ..quant.requant import activation_code_bounds, multiplier_value, quantize_multiplier
from .float_exec import check_feeds, last_uses
from .int_ops import (NP_INT, TORCH_INT, conv_int64, exact_float_dtype, max_abs_code, requantize_fixedpoint,
                      requantize_onnx, requantize_single, value_code)
from .integer_elementwise import ElementwiseKernels, f32

ROUNDING_MODES = ("fixedpoint", "single", "onnx")
ACCUMULATE = ("auto", "int64")  # auto: float kernels where proven exact, else int64

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _channel_shape(arr: np.ndarray, ndim: int, axis: int) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(arr).astype(np.int64) if arr.dtype.kind in "iu" else arr)
    if t.numel() == 1:
        return t.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return t.reshape(shape)


def integer_kind(graph, node) -> str | None:
    """The node's quantization kind where the integer program computes it; None where it runs
    in float (kept in float by the quantizer, or no integers of its own)."""
    kind = get_op(node.op).quant_kind(node, graph)
    out = graph.values[node.outputs[0]] if node.outputs and node.outputs[0] else None
    if out is None or out.quant is None:
        # an op whose own rule computes integers into unquantized outputs (NMS's int64 indices)
        return kind if node.quant and hasattr(get_op(node.op), "integer_forward") else None
    if kind not in ("passthrough", "concat") and not node.quant:
        return None  # quantized around, but no integers of its own: runs in float
    return kind


def quantize_input(x: np.ndarray, p) -> np.ndarray:
    """Float -> codes with the value's parameters (round half to even, saturate), as QuantizeLinear."""
    return p.quantize(np.asarray(x, np.float32))


def dequantize_output(q: np.ndarray, p) -> np.ndarray:
    """Codes -> float32 ``(q - zp) * s``, as DequantizeLinear."""
    return p.dequantize(q)


class IntegerSimulator(ElementwiseKernels):
    """``IntegerSimulator(graph, rounding="fixedpoint").run(feeds)`` -> {output: float32 array}.

    ``accumulate="auto"`` runs integer convolutions and matrix products on float
    kernels where :func:`~npuforge.sim.int_ops.exact_float_dtype` proves them
    exact, in int64 otherwise; ``"int64"`` forces plain int64 everywhere (slow;
    a cross-check). Per-node constants are prepared once and reused across runs.
    """

    def __init__(self, graph, rounding: str = "fixedpoint", accumulate: str = "auto"):
        if rounding not in ROUNDING_MODES:
            raise NpuforgeError(f"rounding mode '{rounding}' is not one of {', '.join(ROUNDING_MODES)}")
        if accumulate not in ACCUMULATE:
            raise NpuforgeError(f"accumulate '{accumulate}' is not one of {', '.join(ACCUMULATE)}")
        if not any(v.quant is not None for v in graph.values.values()):
            raise NpuforgeError(f"graph '{graph.name}' is not quantized; quantize it first (npuforge quantize)")
        self.graph = graph
        self.rounding = rounding
        # integer requantization of the fixed-point modes
        self._R = requantize_single if rounding == "single" else requantize_fixedpoint
        self.accumulate = accumulate
        self._prep: dict[str, dict] = {}
        self.kernels: dict[str, str] = {}  # node -> "float32" / "float64" / "int64" (for reports and tests)

    # -- helpers ---------------------------------------------------------------------
    def _q(self, name):
        return self.graph.values[name].quant

    def _int(self, node, role) -> np.ndarray:
        value = self.graph.values.get(node.quant.get(role, ""))
        if value is None or not value.is_const:  # a hand-edited or damaged quantized file
            raise ModelFormatError(f"node '{node.name}' ({node.op}): its quantization integer '{role}' is missing; "
                                   f"quantize the model again")
        return np.asarray(value.data)

    def _kind(self, node) -> str | None:
        return integer_kind(self.graph, node)

    # -- run -----------------------------------------------------------------------------
    def run(self, feeds: dict, outputs: list[str] | None = None, dequantize: bool = True) -> dict:
        graph = self.graph
        wanted = list(outputs or graph.outputs)
        for name in wanted:
            if name not in graph.values:
                raise NpuforgeError(f"'{name}' is not a value of the graph")
        env: dict[str, torch.Tensor] = {}
        float_feeds, code_feeds = {}, {}
        for name, arr in feeds.items():
            p = graph.values[name].quant if name in graph.values else None
            arr = np.asarray(arr)
            if p is not None and arr.dtype == NP_INT[p.dtype]:
                code_feeds[name] = arr
            else:
                float_feeds[name] = arr
        checked = check_feeds(graph, {**float_feeds, **{n: np.zeros(a.shape, np.float32)
                                                         for n, a in code_feeds.items()}})
        for name in graph.inputs:
            p = self._q(name)
            if name in code_feeds:
                env[name] = torch.from_numpy(np.ascontiguousarray(code_feeds[name]))
            else:
                check_finite(checked[name], f"input '{name}'", "the integer simulator")
                env[name] = torch.from_numpy(quantize_input(checked[name].numpy(), p)) if p is not None \
                    else checked[name]
        last_use = last_uses(graph)
        keep = set(wanted)
        with torch.no_grad():
            for index, node in enumerate(graph.nodes):
                ys = self.run_node(node, env)
                for name, y in zip(node.outputs, ys):
                    if name:
                        env[name] = y
                for name in set(node.inputs):
                    if name and last_use.get(name) == index and name not in keep and name in env:
                        del env[name]
        result = {}
        for name in wanted:
            t = self._get(name, env)
            p = self._q(name)
            if p is not None and not t.dtype.is_floating_point and dequantize:
                result[name] = dequantize_output(t.numpy(), p)
            else:
                result[name] = t.numpy()
        return result

    def run_node(self, node, env: dict) -> list:
        """One node's outputs from ``env`` (value name -> codes, or float tensors where the
        graph stays in float); a kernel's failure is one error naming the node."""
        try:
            return self._node(node, env)
        except (RuntimeError, ValueError, IndexError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise NpuforgeError(f"node '{node.name}' ({node.op}) failed in the integer simulator: {first}") from None

    def _get(self, name: str, env) -> torch.Tensor:
        if name in env:
            return env[name]
        v = self.graph.values[name]
        if v.is_const:
            if v.quant is not None and not np.issubdtype(np.asarray(v.data).dtype, np.integer):
                return torch.from_numpy(v.quant.quantize(v.data))
            return torch.from_numpy(np.array(v.data))
        raise NpuforgeError(f"value '{name}' is not computed yet")

    def _as_codes(self, name: str, env) -> torch.Tensor:
        """An operand as integer codes (a float tensor with parameters is quantized: a float -> int boundary)."""
        t = self._get(name, env)
        if t.dtype.is_floating_point:
            p = self._q(name)
            if p is None:
                raise NpuforgeError(f"value '{name}' is float and has no quantization parameters")
            return torch.from_numpy(p.quantize(t.numpy()))
        return t

    def _as_float(self, name: str, env):
        if not name:
            return None
        t = self._get(name, env)
        p = self._q(name)
        v = self.graph.values[name]
        if p is not None and not t.dtype.is_floating_point and not v.is_const:
            return torch.from_numpy(p.dequantize(t.numpy()))
        if v.is_const:
            return torch.from_numpy(np.array(v.data))
        return t

    def _node(self, node, env) -> list:
        kind = self._kind(node)
        if kind is None or (kind in ("passthrough", "concat") and
                            (self._q(node.inputs[0]) is None or self._get(node.inputs[0], env).dtype.is_floating_point)):
            # kept in float (or shape arithmetic): float inputs, float outputs; a float output
            # with parameters is quantized where it is produced
            ys = get_op(node.op).forward(node, [self._as_float(i, env) for i in node.inputs])
            for o, y in zip(node.outputs, ys):  # where float values are computed (and may become codes)
                if o and y.dtype.is_floating_point:
                    check_finite(y, f"node '{node.name}' ({node.op}) output '{o}'", "the integer simulator")
            return [torch.from_numpy(self._q(o).quantize(y.numpy())) if self._q(o) is not None and
                    y.dtype.is_floating_point else y for o, y in zip(node.outputs, ys)]
        handler = getattr(self, f"_{kind}", None)
        if handler is None:  # a kind whose integer kernel lives with its op (softmax, layernorm)
            return get_op(node.op).integer_forward(self, node, env)
        return handler(node, env)

    def _store(self, y64: torch.Tensor, p, lo=None, hi=None) -> torch.Tensor:
        lo = p.qmin if lo is None else lo
        hi = p.qmax if hi is None else hi
        return y64.clamp(lo, hi).to(TORCH_INT[p.dtype])

    # -- compute ---------------------------------------------------------------------------
    def _act_bounds(self, node, p) -> tuple:
        if p.per_channel and node.attrs.get("activation", "") not in ("", "LeakyRelu"):
            raise UnsupportedError(f"node '{node.name}': fused {node.attrs['activation']} on a per-channel "
                                   f"quantized output")
        if "act_min" in node.quant:  # stored by the quantizer
            lo, hi = (self._int(node, role).astype(np.int64) for role in ("act_min", "act_max"))
            return tuple(int(b) if b.ndim == 0 else b for b in (lo, hi))
        return activation_code_bounds(node, p)  # a graph quantized before the bounds were stored

    def _prep_compute(self, node) -> dict:
        if node.name in self._prep:
            return self._prep[node.name]
        g = self.graph
        op = node.op
        xq = self._q(node.inputs[0])
        yq = self._q(node.outputs[0])
        w = self._int(node, "weight").astype(np.int64)
        bias = self._int(node, "bias").astype(np.int64) if "bias" in node.quant else None
        if op in ("Conv", "ConvTranspose"):
            out_axis = 1
            if op == "Conv":
                rows = np.abs(w).reshape(w.shape[0], -1).sum(axis=1)  # per output channel
            else:  # weight [Cin, Cout/g, *K]: an output reads at most every tap of its channel
                grp = node.attrs["group"]
                cin = w.shape[0]
                wg = np.abs(w).reshape(grp, cin // grp, w.shape[1], -1)
                rows = wg.sum(axis=(1, 3)).reshape(-1)
        else:  # Gemm / MatMul, weight [K, N] (or [N, K] with transB)
            out_axis = 1 if op == "Gemm" else -1
            wt = w.T if (op == "Gemm" and node.attrs["transB"]) else w
            rows = np.abs(wt).sum(axis=0)
        b_abs = int(np.abs(bias).max()) if bias is not None and bias.size else 0
        bound = int(rows.max()) * max_abs_code(xq) if rows.size else 0
        # the bias joins the float sum only when the bound still holds with it; else it is
        # added to the exact accumulator in int64 afterwards
        fold_bias = bias is not None and exact_float_dtype(bound + b_abs) == exact_float_dtype(bound)
        ftype = exact_float_dtype(bound + b_abs if fold_bias else bound) if self.accumulate == "auto" else None
        prep = {"w": w, "bias": bias, "rows": rows, "out_axis": out_axis, "ftype": ftype, "bound": bound,
                "fold_bias": fold_bias, "fits_int32": bound + b_abs < 2**31}
        if ftype is not None:
            prep["wf"] = torch.from_numpy(w).to(ftype)
            if op == "Gemm" and node.attrs["transB"]:
                prep["wf"] = prep["wf"].t().contiguous()
            prep["bf"] = torch.from_numpy(bias).to(ftype) if fold_bias else None
            if bias is not None and not fold_bias:
                shape = [1] * (len(w.shape) if op in ("Conv", "ConvTranspose") else 1)
                shape[0 if len(shape) == 1 else 1] = -1
                prep["bias64"] = torch.from_numpy(bias).reshape(shape)
        self.kernels[node.name] = str(ftype).replace("torch.", "") if ftype is not None else "int64"
        # requantization constants
        if self.rounding != "onnx":
            # TFLite's FULLY_CONNECTED requantizes with one rounding (its 64-bit multiply)
            prep["R"] = requantize_single if "single_rounding" in node.quant else self._R
            prep["M"] = self._int(node, "multiplier").astype(np.int64)
            prep["S"] = self._int(node, "shift").astype(np.int64)
            if node.attrs.get("activation") == "LeakyRelu":
                alpha = node.attrs["activation_params"][0]
                mn, sn = quantize_multiplier(alpha * multiplier_value(prep["M"], prep["S"]))
                prep["Mneg"], prep["Sneg"] = mn.astype(np.int64), sn.astype(np.int64)
        else:
            ws = g.values[node.inputs[1]].quant.scale
            prep["scale"] = (f32(xq.scale) * f32(ws)).astype(np.float32) / f32(yq.scale)
            if node.attrs.get("activation") == "LeakyRelu":
                prep["scale_neg"] = (prep["scale"] * np.float32(node.attrs["activation_params"][0])).astype(np.float32)
        prep["bounds"] = self._act_bounds(node, yq)
        self._prep[node.name] = prep
        return prep

    def _accumulate_compute(self, node, prep, x: torch.Tensor) -> torch.Tensor:
        """int64 accumulator (bias included) of a compute node for input codes x."""
        xq = self._q(node.inputs[0])
        op, a = node.op, node.attrs
        ftype = prep["ftype"]
        zp = torch.from_numpy(xq._broadcast(xq.zero_point.astype(np.int64), x.dim()))
        if ftype is None:
            xs = (x.to(torch.int64) - zp).numpy()
            if op == "Conv":
                acc = conv_int64(xs, prep["w"], a["strides"], a["pads"], a["dilations"], a["group"])
                if prep["bias"] is not None:
                    acc = acc + prep["bias"].reshape(1, -1, *([1] * (xs.ndim - 2)))
            elif op == "ConvTranspose":
                raise UnsupportedError(f"node '{node.name}': ConvTranspose accumulators need more than float64 "
                                       f"(bound {prep['bound']}); no int64 kernel for it")
            else:
                w = prep["w"].T if (op == "Gemm" and a["transB"]) else prep["w"]
                acc = np.matmul(xs, w)
                if prep["bias"] is not None:
                    acc = acc + prep["bias"]
            return torch.from_numpy(np.ascontiguousarray(acc))
        xf = x.to(ftype).sub_(zp.to(ftype))
        if op == "Conv":
            nsp = xf.dim() - 2
            pads = a["pads"]
            if pads[:nsp] == pads[nsp:]:
                padding = pads[:nsp]
            else:
                from ..ops.conv import torch_pad_arg

                xf = F.pad(xf, torch_pad_arg(pads))
                padding = [0] * nsp
            acc = _CONV[nsp](xf, prep["wf"], prep["bf"], a["strides"], padding, a["dilations"], a["group"])
        elif op == "ConvTranspose":
            ys = get_op("ConvTranspose").forward(node, [xf, prep["wf"], prep["bf"]])
            acc = ys[0]
        else:
            acc = torch.matmul(xf, prep["wf"])
            if prep["bf"] is not None:
                acc = acc + prep["bf"]
        acc = acc.to(torch.int64)
        if "bias64" in prep:
            acc += prep["bias64"]
        return acc

    def _requant(self, node, acc: torch.Tensor, prep: dict, axis: int) -> torch.Tensor:
        if self.rounding != "onnx":
            M = _channel_shape(prep["M"], acc.dim(), axis)
            S = _channel_shape(prep["S"], acc.dim(), axis)
            y = prep["R"](acc, M, S, saturate=not prep["fits_int32"])
            if "Mneg" in prep:
                yn = prep["R"](acc, _channel_shape(prep["Mneg"], acc.dim(), axis),
                                           _channel_shape(prep["Sneg"], acc.dim(), axis))
                y = torch.where(acc < 0, yn, y)
            return y
        scale = np.asarray(prep["scale"], np.float32)
        if scale.size > 1:
            shape = [1] * acc.dim()
            shape[axis] = -1
            scale = scale.reshape(shape)
        y = requantize_onnx(acc, scale)
        if "scale_neg" in prep:
            sn = np.asarray(prep["scale_neg"], np.float32).reshape(scale.shape)
            y = torch.where(acc < 0, requantize_onnx(acc, sn), y)
        return y

    def _compute(self, node, env) -> list:
        prep = self._prep_compute(node)
        x = self._as_codes(node.inputs[0], env)
        acc = self._accumulate_compute(node, prep, x)
        axis = prep["out_axis"] % acc.dim()
        y = self._requant(node, acc, prep, axis)
        yq = self._q(node.outputs[0])
        zp = torch.from_numpy(yq._broadcast(yq.zero_point.astype(np.int64), y.dim()))
        lo, hi = prep["bounds"]
        if not (isinstance(lo, int) and isinstance(hi, int)):  # per-channel Clip bounds
            lo, hi = (_channel_shape(np.asarray(b, np.int64), y.dim(), axis) for b in (lo, hi))
        return [y.add_(zp).clamp_(lo, hi).to(TORCH_INT[yq.dtype])]

    # -- matmul (two activations) ---------------------------------------------------------
    def _matmul(self, node, env) -> list:
        aq, bq, yq = self._q(node.inputs[0]), self._q(node.inputs[1]), self._q(node.outputs[0])
        a = self._as_codes(node.inputs[0], env).to(torch.int64) - int(aq.zero_point)
        b = self._as_codes(node.inputs[1], env).to(torch.int64) - int(bq.zero_point)
        k = a.shape[-1]
        bound = k * max_abs_code(aq) * max_abs_code(bq)
        ftype = exact_float_dtype(bound) if self.accumulate == "auto" else None
        acc = torch.matmul(a.to(ftype), b.to(ftype)).to(torch.int64) if ftype is not None else \
            torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
        if self.rounding != "onnx":
            y = self._R(acc, int(self._int(node, "multiplier")[0]), int(self._int(node, "shift")[0]))
        else:
            scale = (f32(aq.scale) * f32(bq.scale)).astype(np.float32) / f32(yq.scale)
            y = requantize_onnx(acc, scale)
        return [self._store(y + int(yq.zero_point), yq)]

    # -- lut -------------------------------------------------------------------------------------
    def _table(self, node) -> torch.Tensor:
        key = f"{node.name}::table"
        if key not in self._prep:
            if self.rounding != "onnx":
                table = self._int(node, "lut").astype(np.int64)
            else:  # rebuilt from the float scales: dequantize every code, the float op, quantize
                xq, yq = self._q(node.inputs[0]), self._q(node.outputs[0])
                codes = np.arange(xq.qmin, xq.qmax + 1)
                xf = torch.from_numpy((codes - np.int64(xq.zero_point)).astype(np.float32) * f32(xq.scale))
                extra = [None if not i else torch.from_numpy(np.array(self.graph.values[i].data))
                         for i in node.inputs[1:]]
                yf = get_op(node.op).forward(node, [xf, *extra])[0].numpy()
                table = yq.quantize(yf).astype(np.int64)
            self._prep[key] = torch.from_numpy(table)
        return self._prep[key]

    def _lut(self, node, env) -> list:
        xq, yq = self._q(node.inputs[0]), self._q(node.outputs[0])
        x = self._as_codes(node.inputs[0], env).to(torch.int64)
        y = self._table(node)[x - xq.qmin]
        return [y.to(TORCH_INT[yq.dtype])]

    # -- moving values ------------------------------------------------------------------------
    def _passthrough(self, node, env) -> list:
        x = self._as_codes(node.inputs[0], env)
        xq = self._q(node.inputs[0])
        rest = []
        for k, name in enumerate(node.inputs[1:], 1):
            if node.op == "Pad" and k == 2 and name:
                v = self.graph.values[name]
                value = float(np.asarray(v.data).reshape(-1)[0]) if v.is_const else 0.0
                if xq.per_channel:
                    raise UnsupportedError(f"node '{node.name}': Pad of a per-channel quantized value")
                rest.append(torch.tensor([float(value_code(value, xq))], dtype=torch.float32))
            elif node.op == "Pad" and k == 2:
                rest.append(torch.tensor([float(int(xq.zero_point))], dtype=torch.float32))
            else:
                rest.append(self._as_float(name, env))
        if node.op == "Pad" and len(node.inputs) == 2:
            rest.append(torch.tensor([float(int(xq.zero_point))], dtype=torch.float32))
        if node.op == "Pad" and len(rest) > 2 and rest[2] is None:
            rest[2] = torch.tensor([float(int(xq.zero_point))], dtype=torch.float32)
        if getattr(get_op(node.op), "zero_fill_input", None) == len(node.inputs):  # where nothing lands: 0.0
            rest.append(torch.tensor([float(int(self._q(node.outputs[0]).zero_point))], dtype=torch.float32))
        # codes of <= 16 bits are exact in float32; the op only moves or selects them
        ys = get_op(node.op).forward(node, [x.to(torch.float32), *rest])
        dtype = TORCH_INT[xq.dtype]
        return [y.to(dtype) if self._q(o) is not None else y for o, y in zip(node.outputs, ys)]

    def _concat(self, node, env) -> list:
        yq = self._q(node.outputs[0])
        xs = []
        for name in node.inputs:
            if not self._q(name).same_as(yq):
                raise NpuforgeError(f"node '{node.name}': Concat input '{name}' does not share the output's "
                                    f"quantization parameters")
            xs.append(self._as_codes(name, env))
        return [torch.cat(xs, dim=node.attrs["axis"])]


def run_integer(graph, feeds: dict, outputs: list[str] | None = None, rounding: str = "fixedpoint",
                dequantize: bool = True) -> dict:
    """One run of the integer simulator (see :class:`IntegerSimulator`)."""
    return IntegerSimulator(graph, rounding).run(feeds, outputs, dequantize)
