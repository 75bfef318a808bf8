"""SequenceLSTM: TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM as one node, as an int8 ``.tflite`` file
gives it (float LSTMs, ONNX's and TFLite's, are unrolled into ordinary ops at import instead).

Inputs, "" where absent: ``x`` ([batch, time, n_input], or time-major), the input weights of
gates i, f, c, o ([n_cell, n_input]), the recurrent weights ([n_cell, n_output]), the
peephole weights of i, f, o ([n_cell]), the gate biases ([n_cell]), the projection weights
([n_output, n_cell]) and bias, and the gates' layer-normalization coefficients ([n_cell]).
No input gate (i's weights absent) is CIFG: ``i = 1 - f``.
The states start from zero, as LiteRT's after its tensors are allocated.

The float computation is LiteRT's float kernel with tanh on the dequantized weights; the
integer one (quantization kind "lstm") is LiteRT's int8 8x8_16 kernel, in
:mod:`npuforge.quant.lstm_rule`.
"""

from __future__ import annotations

import torch

from .registry import FLOAT, FLOATS, INT, Op, TensorInfo, fail, register

SLOTS = ("x", "W_i", "W_f", "W_c", "W_o", "R_i", "R_f", "R_c", "R_o", "p_i", "p_f", "p_o",
         "b_i", "b_f", "b_c", "b_o", "P", "Pb", "ln_i", "ln_f", "ln_c", "ln_o")


def lstm_slots(node) -> dict:
    """Role -> value name (or "") of a SequenceLSTM's inputs, and "gates": the gates it has."""
    names = list(node.inputs) + [""] * (len(SLOTS) - len(node.inputs))
    slots = dict(zip(SLOTS, names))
    slots["gates"] = "fco" if not slots["W_i"] else "ifco"
    return slots


@register
class SequenceLSTM(Op):
    name = "SequenceLSTM"
    inputs = (1, len(SLOTS))  # (W_i is absent in a CIFG LSTM: infer checks which are required)
    attrs = {"time_major": 0, "cell_clip": 0.0, "proj_clip": 0.0, "cell_scale_log2": -15,
             "hidden_scale": 1.0, "hidden_zero_point": 0, "gate_scales": []}
    # gate_scales: the pre-activation scales of gates i, f, c, o with layer normalization (the file's
    # intermediate tensors 0-3); hidden_*: the parameters of o * tanh(c) (the fifth)
    attr_kinds = {"time_major": INT, "cell_clip": FLOAT, "proj_clip": FLOAT, "cell_scale_log2": INT,
                  "hidden_scale": FLOAT, "hidden_zero_point": INT, "gate_scales": FLOATS}
    attr_ranges = {"time_major": (0, 1), "cell_scale_log2": (-30, -9), "hidden_zero_point": (-128, 127)}
    summary = ("TFLite's int8 UNIDIRECTIONAL_SEQUENCE_LSTM (from an int8 .tflite): tanh cell, optional CIFG, "
               "peepholes, projection and clips; int8: LiteRT's 8x8_16 arithmetic bit for bit")
    quant = "lstm"

    def infer(self, node, ins):
        slots = lstm_slots(node)
        by = dict(zip(SLOTS, list(ins) + [None] * (len(SLOTS) - len(ins))))
        x = by["x"]
        needed = [s for s in ("W_f", "W_c", "W_o", "R_f", "R_c", "R_o") if by[s] is None]
        if needed or (by["W_i"] is None) != (by["R_i"] is None):
            fail(node, f"the weights {needed or ['W_i', 'R_i']} are missing (only the input gate's may be absent)")
        if len(x.shape) != 3:
            fail(node, f"x must be 3-D, got {list(x.shape)}")
        n_cell, n_out = by["R_f"].shape
        if by["P"] is None and n_out != n_cell:
            fail(node, f"an output width {n_out} other than the cell's {n_cell}, with no projection")
        for g in slots["gates"]:
            if by[f"W_{g}"] is None or by[f"W_{g}"].shape != (n_cell, x.shape[2]):
                fail(node, f"gate {g}'s input weights must be [{n_cell}, {x.shape[2]}]")
        return [TensorInfo(x.dtype, tuple(x.shape[:2]) + (n_out,))]

    def forward(self, node, xs):
        slots = lstm_slots(node)
        v = dict(zip(SLOTS, list(xs) + [None] * (len(SLOTS) - len(xs))))
        a = node.attrs
        x = v["x"].transpose(0, 1) if a["time_major"] else v["x"]
        batch, steps = x.shape[:2]
        n_cell, n_out = v["R_f"].shape
        h = x.new_zeros(batch, n_out)
        c = x.new_zeros(batch, n_cell)

        def pre(g, x_t, h, c):
            z = x_t @ v[f"W_{g}"].T + h @ v[f"R_{g}"].T
            if v.get(f"p_{g}") is not None:
                z = z + v[f"p_{g}"] * c
            if v[f"ln_{g}"] is not None:  # normalized over the cell units (LiteRT's epsilon), then scaled
                mean = z.mean(-1, keepdim=True)
                z = (z - mean) / torch.sqrt(((z - mean) ** 2).mean(-1, keepdim=True) + 1e-8) * v[f"ln_{g}"]
            return z + v[f"b_{g}"] if v[f"b_{g}"] is not None else z

        outs = []
        for t in range(steps):
            x_t = x[:, t]
            f = torch.sigmoid(pre("f", x_t, h, c))
            i = torch.sigmoid(pre("i", x_t, h, c)) if "i" in slots["gates"] else 1 - f
            c = f * c + i * torch.tanh(pre("c", x_t, h, c))
            if a["cell_clip"] > 0:
                c = c.clamp(-a["cell_clip"], a["cell_clip"])
            h = torch.sigmoid(pre("o", x_t, h, c)) * torch.tanh(c)
            if v["P"] is not None:
                h = h @ v["P"].T + (v["Pb"] if v["Pb"] is not None else 0)
                if a["proj_clip"] > 0:
                    h = h.clamp(-a["proj_clip"], a["proj_clip"])
            outs.append(h)
        return [torch.stack(outs, 0 if a["time_major"] else 1)]

    def onnx_nodes(self, node):
        from ..errors import UnsupportedError

        raise UnsupportedError(f"node '{node.name}' (SequenceLSTM): TFLite's int8 LSTM has no ONNX form (ONNX's LSTM "
                               f"has neither its integer arithmetic nor its projection and cell clip); write it with "
                               f"--format tflite")

    def quantize_integers(self, graph, node, add):
        from ..quant.lstm_rule import quantize_integers

        quantize_integers(graph, node, add)

    def integer_forward(self, sim, node, env):
        from ..quant.lstm_rule import integer_forward

        return integer_forward(sim, node, env)

    def macs(self, node, ins, outs):
        by = dict(zip(SLOTS, ins))
        steps = by["x"].shape[0 if node.attrs["time_major"] else 1]
        steps = steps if isinstance(steps, int) else 1
        n_cell, n_out = by["R_f"].shape
        per_step = len(lstm_slots(node)["gates"]) * n_cell * (by["x"].shape[2] + n_out)
        return steps * (per_step + (n_cell * n_out if by.get("P") is not None else 0))
