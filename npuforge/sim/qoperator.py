"""The ``onnx`` rounding mode's fast path: the quantized IR as ONNX Runtime's own
integer operators (QOperator form), on uint8 codes.

The ``onnx`` mode is *defined* as ONNX Runtime's QLinear arithmetic, and the
plain simulator is checked against each of those operators bit for bit
(tests/test_sim_integer.py). So where every activation is uint8, the program
can run as those operators themselves:

* Conv / Gemm: ``QLinearConv`` (a Gemm as a 1x1 one on ``[N, K, 1, 1]``) with the
  int8 weights stored as uint8 ``w + 128``, zero point 128. The accumulator is
  unchanged, ``sum (x - zp_x) (w + 128 - 128)``, and ONNX Runtime's u8u8 kernels
  compute it exactly; its u8s8 kernels on CPUs without VNNI add pairs of
  products in saturating int16 and would not (docs/simulator.md). A fused
  Relu / Clip narrower than the type is a ``Clip`` on the codes.
* Add / Mul: com.microsoft ``QLinearAdd`` / ``QLinearMul``; GlobalAveragePool:
  ``QLinearGlobalAveragePool``.
* lookup ops: ``Gather`` from the plain simulator's table.
* ops that move codes: the op itself, on uint8.

Anything else raises :class:`~npuforge.errors.UnsupportedError` and the float
lowering (:mod:`npuforge.sim.lowered`) is tried instead.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..export.onnx_export import _nodes_of
from ..ops.activation import FUSED_ATTRS
from .lowering_base import LoweringBuilder

MOVERS = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "MaxPool", "Slice", "Split",
          "Gather", "Concat"}


class QOperatorBuilder(LoweringBuilder):
    ELEM_TYPE, SUFFIX, DOMAINS = TensorProto.UINT8, "qoperator", ("com.microsoft",)

    def qparams(self, node, name: str) -> list[str]:
        """[scale, zero point] initializers of a uint8 per-tensor activation (or a refusal)."""
        v = self.graph.values[name]
        p = v.quant
        if v.is_const or p is None or p.dtype != "uint8" or p.per_channel:
            self.refuse(node, f"'{name}' is not a uint8 per-tensor activation")
        return [self.const(f"{name}::scale", np.float32(p.scale)), self.const(f"{name}::zp", np.uint8(p.zero_point))]

    def check_inputs(self) -> None:
        if self.plain.rounding != "onnx":
            self.refuse(None, "ONNX Runtime's integer operators round as the onnx mode only")
        for name in self.graph.inputs:
            self.qparams(None, name)

    def _compute(self, node):
        prep = self.plain._prep_compute(node)
        if node.op not in ("Conv", "Gemm") or node.attrs.get("activation") == "LeakyRelu":
            self.refuse(node, "no QLinearConv form")
        x, y = node.inputs[0], node.outputs[0]
        wq = self.graph.values[node.inputs[1]].quant
        w = prep["w"]
        if node.op == "Gemm":
            w = (w if node.attrs["transB"] else w.T)[:, :, None, None]  # [N, K, 1, 1]
        scale = np.asarray(wq.scale, np.float32)
        ins = [x, *self.qparams(node, x),
               self.const(f"{node.name}::w", (w + 128).astype(np.uint8)),
               self.const(f"{node.name}::w_scale", scale),
               self.const(f"{node.name}::w_zp", np.full(scale.shape, 128, np.uint8)),
               *self.qparams(node, y)]
        if prep["bias"] is not None:
            if prep["bias"].min(initial=0) < -(2**31) or prep["bias"].max(initial=0) >= 2**31:
                self.refuse(node, "a bias beyond int32")
            ins.append(self.const(f"{node.name}::b", prep["bias"].astype(np.int32)))
        lo, hi = prep["bounds"]
        p = self.graph.values[y].quant
        if not (isinstance(lo, int) and isinstance(hi, int)):
            self.refuse(node, "per-channel saturation bounds")
        out = y if (lo, hi) == (p.qmin, p.qmax) else f"{y}::wide"
        if node.op == "Conv":
            attrs = {k: v for k, v in node.attrs.items() if k not in FUSED_ATTRS and v is not None and v != []}
            self.emit("QLinearConv", ins, out, **attrs)
        else:
            axes = self.const(f"{node.name}::axes", np.int64([2, 3]))
            self.emit("Unsqueeze", [x, axes], f"{x}::{node.name}::4d")
            ins[0] = f"{x}::{node.name}::4d"
            self.emit("QLinearConv", ins, f"{out}::4d")
            self.emit("Squeeze", [f"{out}::4d", axes], out)
        if out != y:  # a fused Relu / Clip narrower than the type
            self.emit("Clip", [out, self.const(f"{y}::lo", np.uint8(lo)), self.const(f"{y}::hi", np.uint8(hi))], y)
        self.report[node.name] = "QLinearConv"

    def _elementwise(self, node):
        if node.op not in ("Add", "Mul") or any(f"input{k}" in node.quant for k in range(2)):
            self.refuse(node, "no QLinear form (Sub, or a constant operand)")
        a, b = node.inputs[:2]
        self.emit(f"QLinear{node.op}", [a, *self.qparams(node, a), b, *self.qparams(node, b),
                                       *self.qparams(node, node.outputs[0])], node.outputs[0], "com.microsoft")

    def _pool(self, node):
        if node.op != "GlobalAveragePool":
            self.refuse(node, "no QLinear form for this pooling")
        x = node.inputs[0]
        self.emit("QLinearGlobalAveragePool", [x, *self.qparams(node, x), *self.qparams(node, node.outputs[0])],
                  node.outputs[0], "com.microsoft", channels_last=0)

    def _lut(self, node):
        x = node.inputs[0]
        self.qparams(node, x), self.qparams(node, node.outputs[0])
        table = self.plain._table(node).numpy().astype(np.uint8)  # indexed by the uint8 code (qmin 0)
        idx = self.emit("Cast", [x], f"{node.name}::idx", to=TensorProto.INT32)
        self.emit("Gather", [self.const(f"{node.name}::table", table), idx], node.outputs[0], axis=0)

    def _passthrough(self, node):
        if node.op not in MOVERS:
            self.refuse(node, "no uint8 form")
        self.qparams(node, node.inputs[0])
        g = self.graph
        for name in node.inputs[1:]:
            if name and not g.values[name].is_const:
                self.refuse(node, f"input '{name}' is computed")
            if name and node.op == "Concat":
                self.qparams(node, name)
            elif name:
                self.const(name, np.asarray(g.values[name].data))
        if node.op == "Concat":
            p = g.values[node.outputs[0]].quant
            if not all(g.values[n].quant.same_as(p) for n in node.inputs):
                self.refuse(node, "inputs with other parameters than the output's")
        self.nodes.extend(_nodes_of(g, node))

    _concat = _passthrough
