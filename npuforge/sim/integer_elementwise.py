"""Elementwise and pooling kernels of the integer simulator (a mixin of
:class:`~npuforge.sim.integer.IntegerSimulator`; the rules are in that module's docstring):
Add / Sub / Mul with rescaling (npuforge's two-multiplier Add, TFLite's three-multiplier
ADD, ONNX Runtime's QLinearAdd / QLinearMul), and integer average pooling with rounded
division (window sums, global means, TFLite's MEAN and AVERAGE_POOL_2D)."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import UnsupportedError
from ..ops.registry import get_op
from ..quant.fixedpoint import round_half_away
from ..quant.requant import extra_bits
from .int_ops import max_abs_code, rounding_divide, rounding_divide_by_pot



def f32(x) -> np.ndarray:
    return np.asarray(x, np.float32)


class ElementwiseKernels:
    """``_elementwise``, ``_pool`` and ``pool_output`` for the integer simulator (needs its
    ``_q``, ``_int``, ``_R``, ``_as_codes``, ``_store``, ``rounding`` and ``graph``)."""

    # -- elementwise ---------------------------------------------------------------------------
    def _operand(self, node, k, env) -> torch.Tensor:
        role = f"input{k}"
        if role in node.quant:
            return torch.from_numpy(self._int(node, role).astype(np.int64))
        return self._as_codes(node.inputs[k], env).to(torch.int64)

    def _elementwise(self, node, env) -> list:
        qs = [self._q(i) for i in node.inputs[:2]]
        yq = self._q(node.outputs[0])
        xs = [self._operand(node, k, env) - int(qs[k].zero_point) for k in range(2)]
        zy = int(yq.zero_point)
        if self.rounding == "onnx":
            return [self._store(self._elementwise_onnx(node, xs, qs, yq), yq)]
        if node.op == "Mul":
            y = self._R(xs[0] * xs[1], int(self._int(node, "multiplier")[0]),
                                      int(self._int(node, "shift")[0]))
            return [self._store(y + zy, yq)]
        if node.op not in ("Add", "Sub"):
            raise UnsupportedError(f"node '{node.name}': no integer rule for elementwise {node.op}")
        if "multiplierout" in node.quant:
            return [self._store(self._add_tflite(node, xs) + zy, yq)]
        shifts = [int(self._int(node, f"shift{k}")[0]) for k in range(2)]
        bits = min(extra_bits(max_abs_code(qs[k]), shifts[k]) for k in range(2))
        ts = [self._R(xs[k] << bits, int(self._int(node, f"multiplier{k}")[0]), shifts[k])
              for k in range(2)]
        total = ts[0] + ts[1] if node.op == "Add" else ts[0] - ts[1]
        y = rounding_divide_by_pot(total, bits)
        return [self._store(y + zy, yq)]

    def _add_tflite(self, node, xs) -> torch.Tensor:
        """TFLite's int8 ADD / SUB: each operand shifted left by ``left_shift`` bits and
        rescaled by its own multiplier (to at most half the sum's scale), the sum (or
        difference) requantized by the output multiplier."""
        bits = int(self._int(node, "left_shift"))
        ts = [self._R(xs[k] << bits, int(self._int(node, f"multiplier{k}")[0]), int(self._int(node, f"shift{k}")[0]))
              for k in range(2)]
        total = ts[0] + ts[1] if node.op == "Add" else ts[0] - ts[1]
        return self._R(total, int(self._int(node, "multiplierout")[0]), int(self._int(node, "shiftout")[0]))

    def _elementwise_onnx(self, node, xs, qs, yq) -> torch.Tensor:
        """ONNX Runtime's QLinearAdd / QLinearMul arithmetic (com.microsoft), in float32."""
        sa, sb, sy = f32(qs[0].scale), f32(qs[1].scale), f32(yq.scale)
        a, b = xs[0].to(torch.float32), xs[1].to(torch.float32)
        if node.op == "Mul":
            ratio = torch.tensor((sa * sb) / sy)
            y = torch.round(a * b * ratio)
        else:
            ra, rb = torch.tensor(sa / sy), torch.tensor(sb / sy)
            y = torch.round(a * ra + b * rb) if node.op == "Add" else torch.round(a * ra - b * rb)
        return y.to(torch.int64) + int(yq.zero_point)

    # -- pooling ---------------------------------------------------------------------------------
    def _window_sums(self, node, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of x' over each window, element count of each window), both int64."""
        op = node.op
        if op == "GlobalAveragePool":
            dims = tuple(range(2, x.dim()))
            count = int(np.prod([x.shape[d] for d in dims]))
            return x.sum(dim=dims, keepdim=True), torch.tensor(count)
        if op in ("ReduceMean", "ReduceSum"):
            axes_name = node.inputs[1] if len(node.inputs) > 1 else ""
            axes = [int(v) % x.dim() for v in np.asarray(self.graph.values[axes_name].data).reshape(-1)] \
                if axes_name else []
            if not axes:
                if node.attrs["noop_with_empty_axes"]:
                    return x, torch.tensor(1)
                axes = list(range(x.dim()))
            count = int(np.prod([x.shape[d] for d in axes]))
            return x.sum(dim=axes, keepdim=bool(node.attrs["keepdims"])), torch.tensor(count)
        # exact: window sums of int16 codes are far below 2^53
        total, count = get_op("AveragePool").window_sums(node, x.to(torch.float64))
        return total.to(torch.int64), count.to(torch.int64)

    def _pool(self, node, env) -> list:
        xq, yq = self._q(node.inputs[0]), self._q(node.outputs[0])
        x = self._as_codes(node.inputs[0], env).to(torch.int64) - int(xq.zero_point)
        total, count = self._window_sums(node, x)
        return [self._store(self.pool_output(node, total, count), yq)]

    def pool_output(self, node, total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Output codes (int64, before saturation) of a pooling node from its window sums of
        ``x - zp_x`` and their element counts."""
        xq, yq = self._q(node.inputs[0]), self._q(node.outputs[0])
        zy = int(yq.zero_point)
        if "code_average" in node.quant:  # TFLite's AVERAGE_POOL_2D: the codes' own rounded mean
            return rounding_divide(total + count * int(xq.zero_point), count)
        if "sum_scale" in node.quant:  # LiteRT's int8 SUM: float32 on the codes' sum, rounded half away
            scale, bias = (self._int(node, role).astype(np.int32).view(np.float32)[0] for role in ("sum_scale",
                                                                                                  "sum_bias"))
            return tflite_sum_output(total + count * int(xq.zero_point), scale, bias) + zy
        if "divisor" in node.quant:  # 1: the count is folded into the multiplier (TFLite's MEAN)
            divisor = torch.full_like(count, int(self._int(node, "divisor")))
        else:
            divisor = torch.ones_like(count) if node.op == "ReduceSum" else count  # a sum is a mean times its count
        if self.rounding == "onnx":
            if node.op in ("GlobalAveragePool", "ReduceMean", "ReduceSum"):
                # MLAS QLinearGlobalAveragePool: float32(sum) * (s_x / (s_y * count)), half to even
                n = np.float32(int(divisor))
                scale = f32(xq.scale) / (f32(yq.scale) * n)
                y = torch.round(total.to(torch.float32) * torch.tensor(scale)).to(torch.int64)
            else:
                # QLinearAveragePool: dequantize, average in float32, quantize
                avg = (total.to(torch.float32) * torch.tensor(f32(xq.scale))) / count.to(torch.float32)
                y = torch.round(avg / torch.tensor(f32(yq.scale))).to(torch.int64)
            return y + zy
        m, s = int(self._int(node, "multiplier")[0]), int(self._int(node, "shift")[0])
        bits = int(self._int(node, "extra_bits")) if "extra_bits" in node.quant else \
            extra_bits(int(count.max()) * max_abs_code(xq), s)
        t = self._R(total << bits, m, s)
        return rounding_divide(t, divisor << bits) + zy


def tflite_sum_scale_bias(x_scale, x_zero_point: int, y_scale, count: int) -> tuple:
    """LiteRT's int8 SUM (its optimized kernel, the one it runs): ``s = s_x / s_y`` and the bias
    ``-zp_x * s * count``, each a float32 operation in that order. A node stores them as the int32
    bit patterns of the float32 numbers (roles ``sum_scale``, ``sum_bias``)."""
    s = np.float32(np.float32(x_scale) / np.float32(y_scale))
    return s, np.float32(np.float32(np.float32(-int(x_zero_point)) * s) * np.float32(count))


def tflite_sum_output(raw_sum: torch.Tensor, scale, bias) -> torch.Tensor:
    """``round_half_away(float32(raw_sum) * s + b)`` in float32 (int64, before the zero point and the
    saturation): the sum of the raw codes is exact in float32 below 2^24."""
    v = raw_sum.to(torch.float32) * torch.tensor(np.float32(scale)) + torch.tensor(np.float32(bias))
    return torch.from_numpy(round_half_away(v.numpy())).to(torch.int64)
