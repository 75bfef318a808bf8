"""ONNX LSTM, GRU and RNN, unrolled at import into the IR's own ops.

The sequence length is fixed once the input shapes are (as a Loop's trip count is), so each
time step becomes MatMul / Add / activation / Mul nodes, and the rest of npuforge (the
optimizer, every quantization rule, the integer simulator, QDQ and TFLite export) sees
ordinary ops. Each gate is its own MatMul, so each gate's pre-activation is its own value and
gets its own quantization scale, as TFLite's integer LSTM gives each gate its own.

The input projection of every step is one MatMul over the whole sequence ([seq, batch, input]
x [input, hidden] + both biases); a step then reads its row (Gather) and adds the recurrent
MatMul. At the first step without initial_h / initial_c, the terms that read the zero state
are left out (their value is exactly zero, or the recurrent bias alone).

Semantics follow the ONNX spec, with ONNX Runtime's reading where the spec is loose:
activation_alpha / activation_beta are consumed only by the activations that take them, in
order, with LeakyRelu 0.01, HardSigmoid 0.2 / 0.5 and Elu 1.0 as defaults (0 otherwise).
Weights (W, R, B, P) must be known at import; sequence_lens, when given, must be known and
every sequence the full length.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError, UnsupportedError

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
MAX_STEPS = 1024  # time steps unrolled at most (as a Loop's iterations)
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_COMMON_ATTRS = {"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout"}
_OWN_ATTRS = {"LSTM": {"input_forget"}, "GRU": {"linear_before_reset"}, "RNN": set()}
# activation -> (takes alpha, takes beta, default alpha, default beta), ONNX Runtime's table
_ACTIVATIONS = {"relu": (False, False, 0.0, 0.0), "tanh": (False, False, 0.0, 0.0),
                "sigmoid": (False, False, 0.0, 0.0), "softsign": (False, False, 0.0, 0.0),
                "softplus": (False, False, 0.0, 0.0), "affine": (True, True, 0.0, 0.0),
                "leakyrelu": (True, False, 0.01, 0.0), "thresholdedrelu": (True, False, 0.0, 0.0),
                "scaledtanh": (True, True, 0.0, 0.0), "hardsigmoid": (True, True, 0.2, 0.5),
                "elu": (True, False, 1.0, 0.0)}
_ONNX_NAMES = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign", "softplus": "Softplus",
               "leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu", "hardsigmoid": "HardSigmoid",
               "elu": "Elu"}


def _activations(kind: str, attrs: dict, directions: int, at: str) -> list:
    """[(name, alpha, beta)] per direction: f, g, h in LSTM order."""
    per = len(_DEFAULT_ACTIVATIONS[kind])
    names = attrs.get("activations") or list(_DEFAULT_ACTIVATIONS[kind]) * directions
    if len(names) != per * directions:
        raise ModelFormatError(f"{at}: 'activations' lists {len(names)} functions; {kind} takes {per} per "
                               f"direction ({per * directions} here)")
    alphas, betas = list(attrs.get("activation_alpha") or []), list(attrs.get("activation_beta") or [])
    out = []
    for name in names:
        key = str(name).lower()
        if key not in _ACTIVATIONS:
            raise UnsupportedError(f"{at}: activation '{name}' is not one the ONNX spec allows for {kind} "
                                   f"({', '.join(sorted(_ACTIVATIONS))})")
        takes_a, takes_b, da, db = _ACTIVATIONS[key]
        alpha = (alphas.pop(0) if alphas else da) if takes_a else 0.0
        beta = (betas.pop(0) if betas else db) if takes_b else 0.0
        out.append((key, float(alpha), float(beta)))
    return [out[d * per:(d + 1) * per] for d in range(directions)]


class _Unroller:
    def __init__(self, imp, onode, node_name: str, at: str, attrs: dict):
        self.imp, self.node, self.name, self.at, self.attrs = imp, onode, node_name, at, attrs
        self.kind = onode.op_type

    # -- emission helpers: every value and node is named <node>/<what>
    def fresh(self, what: str) -> str:
        return self.imp.fresh(f"{self.name}/{what}")

    def emit(self, op: str, inputs: list, what: str, out: str | None = None, **attrs) -> str:
        out = out or self.fresh(what)
        self.imp.emit(op, inputs, [out], f"{self.name}/{what}", **attrs)
        return out

    def const(self, what: str, data) -> str:
        return self.imp.const(f"{self.name}/{what}", np.asarray(data))

    def activation(self, x: str, act: tuple, what: str) -> str:
        key, alpha, beta = act
        if key == "affine":
            y = self.emit("Mul", [x, self.const(f"{what}_alpha", np.float32(alpha))], f"{what}_scaled")
            return self.emit("Add", [y, self.const(f"{what}_beta", np.float32(beta))], what)
        if key == "scaledtanh":
            y = self.emit("Mul", [x, self.const(f"{what}_beta", np.float32(beta))], f"{what}_scaled")
            y = self.emit("Tanh", [y], f"{what}_tanh")
            return self.emit("Mul", [y, self.const(f"{what}_alpha", np.float32(alpha))], what)
        op = _ONNX_NAMES[key]
        if key in ("leakyrelu", "thresholdedrelu", "elu"):
            return self.emit(op, [x], what, alpha=alpha)
        if key == "hardsigmoid":
            return self.emit(op, [x], what, alpha=alpha, beta=beta)
        return self.emit(op, [x], what)

    def add(self, terms: list, what: str) -> str:
        terms = [t for t in terms if t]
        total = terms[0]
        for k, t in enumerate(terms[1:]):
            total = self.emit("Add", [total, t], what if k == len(terms) - 2 else f"{what}_sum{k}")
        return total

    def clip(self, x: str, what: str) -> str:
        bound = self.attrs.get("clip")
        if bound is None:
            return x
        return self.emit("Clip", [x, self.lo, self.hi], f"{what}_clip")

    # -- inputs
    def weight(self, index: int, label: str, required: bool) -> np.ndarray | None:
        ins = self.node.input
        name = ins[index] if index < len(ins) else ""
        if not name:
            if required:
                raise ModelFormatError(f"{self.at}: input {label} is missing")
            return None
        value = self.imp.folded(name)
        if value is None:
            raise UnsupportedError(f"{self.at}: its {label} '{name}' is computed at run time; npuforge imports "
                                   f"{self.kind} only with W, R, B and P known at import (constant weights)")
        return value.astype(np.float32)

    def state(self, index: int, label: str, d: int) -> str | None:
        """Direction d's initial state [batch, hidden], or None (zeros)."""
        ins = self.node.input
        name = ins[index] if index < len(ins) else ""
        if not name:
            return None
        info = self.imp.ctx.info(name)
        if info.shape is not None and len(info.shape) != 3:
            raise ModelFormatError(f"{self.at}: {label} '{name}' has rank {len(info.shape)}, expected 3")
        axis = 1 if self.layout else 0
        return self.emit("Gather", [name, self.const(f"{label}_dir{d}", np.int64(d))], f"{label}_dir{d}", axis=axis)

    def check_sequence_lens(self, seq: int) -> None:
        ins = self.node.input
        name = ins[4] if len(ins) > 4 else ""
        if not name:
            return
        lens = self.imp.known(name)
        if lens is None or not (np.asarray(lens) == seq).all():
            raise UnsupportedError(f"{self.at}: sequence_lens '{name}' is not known at import to be the full "
                                   f"length {seq} for every sequence; npuforge imports {self.kind} only with "
                                   f"sequences of one length (drop sequence_lens, or pad every sequence)")

    # -- the whole node
    def run(self) -> None:
        kind, attrs, at = self.kind, self.attrs, self.at
        unknown = set(attrs) - _COMMON_ATTRS - _OWN_ATTRS[kind]
        if unknown:
            raise UnsupportedError(f"{at}: attribute '{sorted(unknown)[0]}' is not supported; supported: "
                                   f"{', '.join(sorted(_COMMON_ATTRS | _OWN_ATTRS[kind]))}")
        most = 3 if kind == "LSTM" else 2
        if len(self.node.output) > most:
            raise ModelFormatError(f"{at}: {kind} has at most {most} outputs, not {len(self.node.output)}")
        direction = attrs.get("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ModelFormatError(f"{at}: direction '{direction}' is not forward, reverse or bidirectional")
        dirs = 2 if direction == "bidirectional" else 1
        self.layout = int(attrs.get("layout", 0))
        if self.layout not in (0, 1):
            raise ModelFormatError(f"{at}: layout {self.layout} is not 0 or 1")
        gates = _GATES[kind]
        x = self.node.input[0] if self.node.input else ""
        if not x:
            raise ModelFormatError(f"{at}: input X is missing")
        xshape = self.imp.ctx.info(x).shape
        if len(xshape) != 3:
            raise ModelFormatError(f"{at}: X has shape {list(xshape)}; {kind} takes a 3-D input")
        seq = xshape[1 if self.layout else 0]
        if not isinstance(seq, int):
            raise UnsupportedError(f"{at}: the sequence length of X (dim {1 if self.layout else 0}, '{seq}') is "
                                   f"not fixed; npuforge unrolls {kind} over a known length: fix it with "
                                   f"--input-shape (input_shapes= in the Python API)")
        if seq > MAX_STEPS:
            raise UnsupportedError(f"{at}: a sequence of {seq} steps; npuforge unrolls {kind} over at most "
                                   f"{MAX_STEPS} (fix a shorter length with --input-shape, or split the sequence)")
        W = self.weight(1, "W", True)
        R = self.weight(2, "R", True)
        B = self.weight(3, "B", False)
        P = self.weight(7, "P", False) if kind == "LSTM" else None
        hidden = int(attrs.get("hidden_size", R.shape[-1] if R.ndim == 3 else 0))
        size = xshape[2]
        expect = {"W": (W, (dirs, gates * hidden, size)), "R": (R, (dirs, gates * hidden, hidden)),
                  "B": (B, (dirs, 2 * gates * hidden)), "P": (P, (dirs, 3 * hidden))}
        for label, (value, shape) in expect.items():
            if value is not None and (value.ndim != 3 - (label in "BP") or any(
                    isinstance(e, int) and e != s for e, s in zip(shape, value.shape))):
                raise ModelFormatError(f"{at}: {label} has shape {list(value.shape)}, expected {list(shape)} "
                                       f"({dirs} direction(s), hidden_size {hidden})")
        self.check_sequence_lens(seq)
        if attrs.get("clip") is not None:
            bound = float(attrs["clip"])
            self.lo, self.hi = self.const("clip_lo", np.float32(-bound)), self.const("clip_hi", np.float32(bound))
        acts = _activations(kind, attrs, dirs, at)
        if B is None:
            B = np.zeros((dirs, 2 * gates * hidden), np.float32)
        xs = self.emit("Transpose", [x], "x_seq_first", perm=[1, 0, 2]) if self.layout else x
        self.one = self.const("one", np.float32(1.0))
        steps_of, last_h, last_c = [], [], []
        for d in range(dirs):
            reverse = direction == "reverse" or d == 1
            hs, h, c = self.direction(d, reverse, seq, xs, W[d], R[d], B[d], None if P is None else P[d],
                                      acts[d], hidden)
            steps_of.append(hs)
            last_h.append(h)
            last_c.append(c)
        self.outputs(steps_of, last_h, last_c)

    def direction(self, d, reverse, seq, xs, W, R, B, P, acts, hidden):
        kind, gates = self.kind, _GATES[self.kind]
        rows = lambda m, g: m[g * hidden:(g + 1) * hidden]  # noqa: E731  (gate g's block)
        linear_before_reset = kind == "GRU" and int(self.attrs.get("linear_before_reset", 0)) != 0
        wb, rb = B[:gates * hidden], B[gates * hidden:]
        xw, rt = [], []
        for g in range(gates):
            bias = rows(wb, g) + (0 if linear_before_reset and g == 2 else rows(rb, g))
            proj = self.emit("MatMul", [xs, self.const(f"W{d}_{g}", np.ascontiguousarray(rows(W, g).T))],
                             f"dir{d}/x_proj{g}")
            xw.append(self.emit("Add", [proj, self.const(f"B{d}_{g}", bias.astype(np.float32))],
                                f"dir{d}/x_gate{g}"))
            rt.append(self.const(f"R{d}_{g}", np.ascontiguousarray(rows(R, g).T)))
        rbh = self.const(f"Rb{d}_2", rows(rb, 2).astype(np.float32)) if linear_before_reset else None
        peepholes = None if P is None else [self.const(f"P{d}_{g}", rows(P, g)) for g in range(3)]
        h = self.state(5, "initial_h", d)
        c = self.state(6, "initial_c", d) if kind == "LSTM" else None
        f, g_act = acts[0], acts[1] if len(acts) > 1 else None
        hs = [None] * seq
        for k in range(seq):
            t = seq - 1 - k if reverse else k
            at = f"dir{d}/t{t}"
            idx = self.const(f"{at}/index", np.int64(t))
            x_t = [self.emit("Gather", [xw[g], idx], f"{at}/x_gate{g}", axis=0) for g in range(gates)]
            rec = [self.emit("MatMul", [h, rt[g]], f"{at}/h_proj{g}") if h else None for g in range(gates)]
            if kind == "RNN":
                h = self.activation(self.clip(self.add([x_t[0], rec[0]], f"{at}/pre"), f"{at}/pre"), f, f"{at}/h")
            elif kind == "GRU":
                z = self.activation(self.clip(self.add([x_t[0], rec[0]], f"{at}/pre_z"), f"{at}/pre_z"), f, f"{at}/z")
                r = self.activation(self.clip(self.add([x_t[1], rec[1]], f"{at}/pre_r"), f"{at}/pre_r"), f, f"{at}/r")
                if linear_before_reset:
                    hr = self.emit("Add", [rec[2], rbh], f"{at}/h_proj2_bias") if h else rbh
                    gated = self.emit("Mul", [r, hr], f"{at}/reset")
                elif h:
                    gated = self.emit("MatMul", [self.emit("Mul", [r, h], f"{at}/reset"), rt[2]], f"{at}/reset_proj")
                else:
                    gated = None
                cand = self.activation(self.clip(self.add([x_t[2], gated], f"{at}/pre_h"), f"{at}/pre_h"), g_act,
                                       f"{at}/candidate")
                keep = self.emit("Sub", [self.one, z], f"{at}/one_minus_z")
                new = self.emit("Mul", [keep, cand], f"{at}/update")
                h = self.add([new, self.emit("Mul", [z, h], f"{at}/carry") if h else None], f"{at}/h")
            else:
                h, c = self.lstm_step(at, x_t, rec, c, peepholes, acts)
            hs[t] = h
        return hs, h, c

    def lstm_step(self, at, x_t, rec, c, peepholes, acts):
        f_act, g_act, h_act = acts
        peep = lambda g, state: (self.emit("Mul", [state, peepholes[g]], f"{at}/peephole{g}")  # noqa: E731
                                 if peepholes and state else None)
        # ONNX order i, o, f, c; P order i, o, f
        i = self.activation(self.clip(self.add([x_t[0], rec[0], peep(0, c)], f"{at}/pre_i"), f"{at}/pre_i"),
                            f_act, f"{at}/i")
        if int(self.attrs.get("input_forget", 0)):
            f = self.emit("Sub", [self.one, i], f"{at}/f")
        else:
            f = self.activation(self.clip(self.add([x_t[2], rec[2], peep(2, c)], f"{at}/pre_f"), f"{at}/pre_f"),
                                f_act, f"{at}/f")
        g = self.activation(self.clip(self.add([x_t[3], rec[3]], f"{at}/pre_c"), f"{at}/pre_c"), g_act, f"{at}/g")
        new = self.emit("Mul", [i, g], f"{at}/input")
        c = self.add([self.emit("Mul", [f, c], f"{at}/forget") if c else None, new], f"{at}/c")
        o = self.activation(self.clip(self.add([x_t[1], rec[1], peep(1, c)], f"{at}/pre_o"), f"{at}/pre_o"),
                            f_act, f"{at}/o")
        h = self.emit("Mul", [o, self.activation(c, h_act, f"{at}/c_act")], f"{at}/h")
        return h, c

    # -- Y, Y_h, Y_c
    def stack(self, values: list, axis: int, what: str, out: str | None = None) -> str:
        ax = self.const(f"{what}_axis", np.array([axis], np.int64))
        rows = [self.emit("Unsqueeze", [v, ax], f"{what}_{k}") for k, v in enumerate(values)]
        if len(rows) == 1:
            return self.emit("Identity", rows, what, out)
        return self.emit("Concat", rows, what, out, axis=axis)

    def outputs(self, steps_of, last_h, last_c) -> None:
        y, y_h, y_c = (list(self.node.output) + [""] * 3)[:3]
        if y:
            per_dir = [self.stack(hs, 0, f"dir{d}/y") for d, hs in enumerate(steps_of)]  # [seq, batch, hidden]
            if self.layout:
                both = self.stack(per_dir, 1, "y_dirs")  # [seq, dirs, batch, hidden]
                self.emit("Transpose", [both], "y", y, perm=[2, 0, 1, 3])
            else:
                self.stack(per_dir, 1, "y", y)
        for target, finals, label in ((y_h, last_h, "y_h"), (y_c, last_c, "y_c")):
            if not target:
                continue
            if self.layout:
                both = self.stack(finals, 0, f"{label}_dirs")
                self.emit("Transpose", [both], label, target, perm=[1, 0, 2])
            else:
                self.stack(finals, 0, label, target)


def unroll_recurrent(imp, onode, node_name: str, at: str, attrs: dict) -> None:
    """Convert an ONNX LSTM / GRU / RNN node into its unrolled IR nodes (see the module docstring)."""
    _Unroller(imp, onode, node_name, at, attrs).run()
