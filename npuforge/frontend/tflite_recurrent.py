"""TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM (float), unrolled at import into the IR's own ops,
as :mod:`npuforge.frontend.onnx_recurrent` unrolls ONNX's LSTM: each time step becomes
MatMul / Add / activation / Mul nodes, each gate its own MatMul (its own value, its own
quantization scale later), and the rest of npuforge sees ordinary ops.

The step is LiteRT's float kernel (``lstm_eval.cc``), gates input, forget, cell, output:

* a gate's pre-activation is ``W x_t + R h_{t-1}`` plus, with peepholes, ``p * c_{t-1}``
  (``p * c_t`` for the output gate); with layer normalization it is normalized over the cell
  units (epsilon 1e-8) and scaled by its coefficients, and the gate bias comes after that;
* i, f, o are sigmoids; the cell gate and the cell output use the fused activation (tanh,
  usually); CIFG (no input-gate weights) takes ``i = 1 - f``;
* ``c_t = f * c_{t-1} + i * g``, clipped to ``[-cell_clip, cell_clip]`` when cell_clip > 0;
* ``h_t = o * act(c_t)``, then the projection ``P h_t + b_P`` (clipped to ``proj_clip``) when
  the layer has one.

The states h and c are variable tensors; the import starts from zero, as LiteRT does on its
first invocation or after ``reset_all_variables`` (later invocations continue from the state
the previous one left, which a graph of one invocation does not model).
Weights must be constants; the int8 and hybrid (int8 weights, float activations) kernels and
diagonal recurrent weights are refused by name.
"""

from __future__ import annotations

import warnings

import numpy as np
from tflite.ActivationFunctionType import ActivationFunctionType as Act

from ..quant.lstm_rule import quantize_integers
from ..quant.params import QParams
from ..quant.quantize import _add_int
from .onnx_recurrent import MAX_STEPS

# input tensor slots of UNIDIRECTIONAL_SEQUENCE_LSTM (TFLite's lstm_shared.h)
_X = 0
_W = {"i": 1, "f": 2, "c": 3, "o": 4}  # input-to-gate weights [n_cell, n_input]
_R = {"i": 5, "f": 6, "c": 7, "o": 8}  # recurrent-to-gate weights [n_cell, n_output]
_PEEPHOLE = {"i": 9, "f": 10, "o": 11}  # cell-to-gate weights [n_cell]
_BIAS = {"i": 12, "f": 13, "c": 14, "o": 15}  # [n_cell]
_PROJ_W, _PROJ_B = 16, 17  # [n_output, n_cell], [n_output]
_H0, _C0 = 18, 19  # variable state tensors [batch, n_output], [batch, n_cell]
_NORM = {"i": 20, "f": 21, "c": 22, "o": 23}  # layer-norm coefficients [n_cell]


class RecurrentRules:
    """The LSTM rule of the TFLite importer (mixed into ``_Importer`` with the other rules)."""

    def sequence_lstm(self, ins, o, opt):
        if self.quantized:
            return self._int8_lstm(ins, o, opt)
        if opt.DiagonalRecurrentTensors():
            self.refuse("has diagonal recurrent weights, which npuforge does not import")
        code = opt.FusedActivationFunction()  # the cell gate's and the cell output's: TANH, or a Relu / Clip
        activation = None if code == Act.NONE else ("Tanh", []) if code == Act.TANH else self.fused_form(code)[:2]
        inputs = list(ins) + [-1] * (24 - len(ins))
        if len(ins) > 24:
            self.bad(f"{len(ins)} inputs (UNIDIRECTIONAL_SEQUENCE_LSTM takes 24)")
        have = lambda slot: inputs[slot] >= 0  # noqa: E731
        for slot in (_X, _W["f"], _W["c"], _W["o"], _R["f"], _R["c"], _R["o"], _BIAS["f"], _BIAS["c"], _BIAS["o"],
                     _H0, _C0):
            if not have(slot):
                self.bad(f"no tensor at input {slot}, which the LSTM kernel requires")
        cifg = not have(_W["i"])
        gates = ("f", "c", "o") if cifg else ("i", "f", "c", "o")
        weights = {}
        for g in gates:
            for table, what in ((_W, "input weights"), (_R, "recurrent weights")):
                w = self.const(inputs[table[g]], f"{what} of gate {g}")
                if w.dtype != np.float32:
                    self.refuse(f"has {w.dtype} {what} (the hybrid kernel), which npuforge does not import")
                weights[table[g]] = w
        n_cell, n_input = weights[_W["f"]].shape
        n_output = weights[_R["f"]].shape[1]
        shape = self.file_shape(inputs[_X])
        if len(shape) != 3 or shape[2] != n_input:
            self.bad(f"an input of shape {list(shape)} for input weights [{n_cell}, {n_input}] (it must be "
                     f"[batch, time, {n_input}] or, time-major, [time, batch, {n_input}])")
        time_axis = 0 if opt.TimeMajor() else 1
        steps, batch = shape[time_axis], shape[1 - time_axis]
        if steps > MAX_STEPS:
            self.refuse(f"runs {steps} time steps; npuforge unrolls at most {MAX_STEPS}")
        for g in gates:
            if weights[_W[g]].shape != (n_cell, n_input) or weights[_R[g]].shape != (n_cell, n_output):
                self.bad(f"gate {g}'s weights of shapes {list(weights[_W[g]].shape)} and "
                         f"{list(weights[_R[g]].shape)} (the forget gate's are [{n_cell}, {n_input}] and "
                         f"[{n_cell}, {n_output}])")
        vector = lambda slot, what, n=n_cell: self._lstm_vector(inputs[slot], what, n)  # noqa: E731
        bias = {g: vector(_BIAS[g], f"gate {g}'s bias") for g in gates}
        peephole = {g: vector(_PEEPHOLE[g], f"gate {g}'s peephole weights")
                    for g in ("i", "f", "o") if g in gates and have(_PEEPHOLE[g])}
        norm = {g: vector(_NORM[g], f"gate {g}'s layer-norm coefficients") for g in gates if have(_NORM[g])}
        if norm and set(norm) != set(gates):
            self.bad(f"layer-norm coefficients for gates {sorted(norm)} only (all {len(gates)} or none)")
        proj = None
        if have(_PROJ_W):
            pw = self.const(inputs[_PROJ_W], "projection weights")
            if pw.shape != (n_output, n_cell):
                self.bad(f"projection weights of shape {list(pw.shape)} (it must be [{n_output}, {n_cell}])")
            proj = (pw, vector(_PROJ_B, "projection bias", n_output) if have(_PROJ_B) else None)
        elif n_output != n_cell:
            self.bad(f"an output width {n_output} other than the cell's {n_cell}, with no projection")
        self._lstm_state(inputs[_H0], (batch, n_output), "output state")
        self._lstm_state(inputs[_C0], (batch, n_cell), "cell state")
        if self.file_shape(o) != tuple(shape[:2]) + (n_output,):
            self.bad(f"an output of shape {list(self.file_shape(o))} (the input's {list(shape[:2])} and "
                     f"{n_output} outputs)")
        step = _Step(self, weights, bias, peephole, norm, proj, activation, opt.CellClip(), opt.ProjClip(), cifg)
        x = self.value(inputs[_X])
        h = c = None  # zero states: the first step leaves out the terms that read them
        outs = []
        axes = self.int64s(f"{self.base}::time_axis", [time_axis])
        for t in range(steps):
            x_t = step.emit("Gather", [x, self.int64s(f"{self.base}::t{t}", np.int64(t))], f"x{t}",
                            axis=time_axis)
            h, c = step(x_t, h, c, t)
            outs.append(step.emit("Unsqueeze", [h, axes], f"h{t}"))
        y = outs[0] if steps == 1 else step.emit("Concat", outs, "sequence", axis=time_axis)
        self.bind(o, y)

    def _int8_lstm(self, ins, o, opt):
        """The int8 kernel: one SequenceLSTM node keeping the file's codes and parameters (its
        integer arithmetic is LiteRT's 8x8_16 kernel, npuforge/quant/lstm_rule.py), layer
        normalization included."""
        inputs = list(ins) + [-1] * (24 - len(ins))
        have = lambda slot: inputs[slot] >= 0  # noqa: E731
        if opt.DiagonalRecurrentTensors():
            self.refuse("has diagonal recurrent weights, which npuforge does not import")
        if opt.FusedActivationFunction() != Act.TANH:
            self.refuse("has a cell activation other than TANH; LiteRT's int8 LSTM computes tanh only")
        op = self.sg.Operators(self.op_index)
        inter = [int(t) for t in op.IntermediatesAsNumpy()] if op.IntermediatesLength() else []
        if len(inter) != 5 or not all(0 <= t < self.sg.TensorsLength() for t in inter):
            self.bad(f"{len(inter)} intermediate tensors (LiteRT's int8 LSTM reads 5: the hidden state's "
                     f"parameters from the fifth)")
        hidden = self.qparams(inter[4])
        if hidden is None or hidden.per_channel:
            self.bad("no per-tensor quantization on its hidden-state intermediate (the fifth)")
        norm = [g for g in "ifco" if have(_NORM[g])]
        cifg = not have(_W["i"])
        if norm and norm != list("fco" if cifg else "ifco"):
            self.bad(f"layer-norm coefficients for gates {norm} only (every gate's or none)")
        gate_scales = []
        if norm:  # the gates' pre-activation scales: intermediates 0-3 (the input gate's unread under CIFG)
            for k, g in enumerate("ifco"):
                p = self.qparams(inter[k], self.dtype(inter[k]))
                if p is None or p.per_channel:
                    if g == "i" and cifg:
                        gate_scales.append(1.0)
                        continue
                    self.bad(f"no per-tensor quantization on intermediate {k} (gate {g}'s pre-activation scale, "
                             f"which layer normalization needs)")
                gate_scales.append(float(p.scale))
        expect = {_X: "int8", _PROJ_W: "int8", _PROJ_B: "int32", _H0: "int8", _C0: "int16",
                  **{s: "int8" for s in (*_W.values(), *_R.values())}, **{s: "int32" for s in _BIAS.values()},
                  **{s: "int16" for s in (*_PEEPHOLE.values(), *_NORM.values())}}
        for slot, dtype in expect.items():
            if have(slot) and (self.dtype(inputs[slot]) != dtype or self.qparams(inputs[slot], dtype) is None or
                               self.qparams(inputs[slot], dtype).per_channel):
                self.bad(f"the {self.dtype(inputs[slot])} tensor '{self.tname(inputs[slot])}' at input {slot} "
                         f"(LiteRT's int8 LSTM takes {dtype} there, quantized per tensor)")
        for slot in (_X, _W["f"], _W["c"], _W["o"], _R["f"], _R["c"], _R["o"], _H0, _C0):
            if not have(slot):
                self.bad(f"no tensor at input {slot}, which the LSTM kernel requires")
        y_q, h_q, c_q = self.activation_q(o), self.qparams(inputs[_H0]), self.qparams(inputs[_C0], "int16")
        if not h_q.same_as(y_q):
            self.refuse("has an output state quantized differently from its output, which npuforge does not "
                        "import (its output is the state's codes)")
        log2 = np.log2(np.float64(c_q.scale))
        if log2 != np.round(log2) or not -30 <= log2 <= -9 or int(c_q.zero_point) != 0:
            self.refuse(f"has a cell state of scale {float(c_q.scale):g} and zero point {int(c_q.zero_point)}; "
                        f"LiteRT's int8 LSTM takes a power of two from 2^-30 to 2^-9 with zero point 0")
        if log2 < -15:
            if cifg:
                self.refuse(f"has a cell state of scale 2^{int(log2)} in a CIFG LSTM: LiteRT's int16 tanh takes 0 to "
                            f"6 integer bits, so its hidden state is undefined there")
            warnings.warn(f"{self.where}: {self.at}: a cell state of scale 2^{int(log2)}: LiteRT's int8 LSTM skips "
                          f"the cell's tanh there (its int16 tanh takes 0 to 6 integer bits) and multiplies the "
                          f"output gate by the input gate instead; the integer simulator computes what LiteRT does, "
                          f"the float graph the LSTM", UserWarning, stacklevel=2)
        n_cell, n_output = self.file_shape(inputs[_R["f"]])
        shape = self.file_shape(inputs[_X])
        if len(shape) != 3 or self.file_shape(o) != tuple(shape[:2]) + (n_output,):
            self.bad(f"an input of shape {list(shape)} and output of shape {list(self.file_shape(o))} "
                     f"({n_output} outputs)")
        batch = shape[1] if opt.TimeMajor() else shape[0]
        self._lstm_state(inputs[_H0], (batch, n_output), "output state")
        self._lstm_state(inputs[_C0], (batch, n_cell), "cell state")
        # LiteRT adds the biases' codes at the scale its arithmetic gives them, whatever the file says: the
        # gate's products' (s_W s_x), the normalized gate's (s_norm 2^-10), the projection's (s_P s_hidden)
        scale = lambda slot: np.float32(self.qparams(inputs[slot], self.dtype(inputs[slot])).scale)  # noqa: E731
        bias_scales = {_BIAS[g]: scale(_NORM[g]) * np.float32(2.0**-10) if norm else
                       np.float32(np.float64(scale(_W[g])) * np.float64(scale(_X))) for g in "ifco" if have(_BIAS[g])}
        if have(_PROJ_B):
            bias_scales[_PROJ_B] = np.float32(np.float64(scale(_PROJ_W)) * np.float64(hidden.scale))
        raw = {}  # IR value -> the file's int32 codes (a dequantized bias may not give them back exactly)

        def ir_value(slot: int) -> str:
            if slot not in bias_scales:
                return self.value(inputs[slot])
            codes = self.const(inputs[slot], "bias").astype(np.int64)
            p = QParams("int32", bias_scales[slot], 0)
            name = self.add_const(self.tname(inputs[slot]), p.dequantize(codes), p)
            raw[name] = codes
            return name

        slots = [_X, *_W.values(), *_R.values(), *_PEEPHOLE.values(), *_BIAS.values(), _PROJ_W, _PROJ_B,
                 *_NORM.values()]
        names = [ir_value(s) if have(s) else "" for s in slots]
        attrs = {"time_major": int(bool(opt.TimeMajor())), "cell_clip": float(opt.CellClip()),
                 "proj_clip": float(opt.ProjClip()), "cell_scale_log2": int(log2),
                 "hidden_scale": float(hidden.scale), "hidden_zero_point": int(hidden.zero_point),
                 "gate_scales": gate_scales}
        node = self.emit("SequenceLSTM", names, attrs, self.fresh(self.tname(o)), y_q)
        quantize_integers(self.graph, node, lambda role, data: _add_int(self.graph, node, role, data), raw)
        self.bind(o, node.outputs[0])

    def _lstm_vector(self, i: int, what: str, n: int) -> np.ndarray | None:
        if i < 0:
            return None
        v = self.const(i, what)
        if v.dtype != np.float32 or v.shape != (n,):
            self.bad(f"{what} of shape {list(v.shape)} and type {v.dtype} (float32 [{n}])")
        return v

    def _lstm_state(self, i: int, shape: tuple, what: str) -> None:
        """The initial state: a variable tensor (LiteRT's kernel requires one), zero at the start."""
        if self.file_shape(i) != shape:
            self.bad(f"an {what} of shape {list(self.file_shape(i))} (it must be {list(shape)})")
        if not self.tensor(i).IsVariable():
            self.refuse(f"takes its {what} from a tensor that is not variable (LiteRT's kernel needs a variable "
                        f"state), which npuforge does not import")
        data = self.data(i)
        if data is not None and np.any(data):
            self.refuse(f"starts from a non-zero {what}, which npuforge does not import (it starts from zero)")


class _Step:
    """Emits one time step; ``None`` stands for an exact zero (the first step's state)."""

    def __init__(self, rules, weights, bias, peephole, norm, proj, activation, cell_clip, proj_clip, cifg):
        self.r, self.proj, self.act = rules, proj, activation
        self.cell_clip, self.proj_clip, self.cifg = float(cell_clip), float(proj_clip), cifg
        r = rules
        # weights transposed for MatMul (x [batch, in] @ W^T); constants made once for every step
        self.w = {g: r.add_const(f"{r.base}::W_{g}", np.ascontiguousarray(weights[_W[g]].T)) for g in bias}
        self.rw = {g: r.add_const(f"{r.base}::R_{g}", np.ascontiguousarray(weights[_R[g]].T)) for g in bias}
        self.b = {g: r.add_const(f"{r.base}::b_{g}", bias[g]) for g in bias}
        self.p = {g: r.add_const(f"{r.base}::peephole_{g}", v) for g, v in peephole.items()}
        self.ln = {g: r.add_const(f"{r.base}::norm_{g}", v) for g, v in norm.items()}
        self.one = r.add_const(f"{r.base}::one", np.float32(1.0))
        self.bounds: dict = {}  # (lo, hi) -> their constants, shared by every step's Clip
        if proj is not None:
            self.pw = r.add_const(f"{r.base}::P", np.ascontiguousarray(proj[0].T))
            self.pb = None if proj[1] is None else r.add_const(f"{r.base}::P_bias", proj[1])

    def emit(self, op: str, inputs: list, what: str, **attrs) -> str:
        return self.r.emit(op, inputs, attrs or None, suffix=what).outputs[0]

    def clip(self, x: str, lo: float, hi: float, what: str) -> str:
        if (lo, hi) not in self.bounds:
            self.bounds[lo, hi] = [self.r.add_const(f"{self.r.base}::clip_{k}", np.float32(v))
                                   for k, v in (("lo", lo), ("hi", hi))]
        return self.emit("Clip", [x, *self.bounds[lo, hi]], what)

    def activation(self, x: str, what: str) -> str:
        if self.act is None:
            return x
        op, bounds = self.act
        return self.clip(x, *bounds, what) if op == "Clip" else self.emit(op, [x], what)

    def gate(self, g: str, x: str, h, c, t: int) -> str:
        """The gate's pre-activation, bias included."""
        s = self.emit("MatMul", [x, self.w[g]], f"{g}{t}_x")
        if h is not None:
            s = self.emit("Add", [s, self.emit("MatMul", [h, self.rw[g]], f"{g}{t}_h")], f"{g}{t}_xh")
        if g in self.p and c is not None:
            s = self.emit("Add", [s, self.emit("Mul", [c, self.p[g]], f"{g}{t}_peep")], f"{g}{t}_xhc")
        if self.ln:  # normalized over the cell units, scaled, then the bias
            return self.emit("LayerNormalization", [s, self.ln[g], self.b[g]], f"{g}{t}_norm", axis=-1,
                             epsilon=1e-8)
        return self.emit("Add", [s, self.b[g]], f"{g}{t}")

    def __call__(self, x: str, h, c, t: int):
        f = self.emit("Sigmoid", [self.gate("f", x, h, c, t)], f"f{t}_act")
        i = self.emit("Sub", [self.one, f], f"i{t}_act") if self.cifg else \
            self.emit("Sigmoid", [self.gate("i", x, h, c, t)], f"i{t}_act")
        g = self.activation(self.gate("c", x, h, None, t), f"g{t}_act")
        ig = self.emit("Mul", [i, g], f"ig{t}")
        c = ig if c is None else self.emit("Add", [self.emit("Mul", [f, c], f"fc{t}"), ig], f"c{t}")
        if self.cell_clip > 0:
            c = self.clip(c, -self.cell_clip, self.cell_clip, f"c{t}_clip")
        o = self.emit("Sigmoid", [self.gate("o", x, h, c, t)], f"o{t}_act")
        h = self.emit("Mul", [o, self.activation(c, f"c{t}_out")], f"h{t}_cell")
        if self.proj is not None:
            h = self.emit("MatMul", [h, self.pw], f"h{t}_proj")
            if self.pb is not None:
                h = self.emit("Add", [h, self.pb], f"h{t}_proj_bias")
            if self.proj_clip > 0:
                h = self.clip(h, -self.proj_clip, self.proj_clip, f"h{t}_clip")
        return h, c
