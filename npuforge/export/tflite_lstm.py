"""The TFLite mapping of SequenceLSTM (an int8 LSTM imported from a .tflite file): TFLite's
UNIDIRECTIONAL_SEQUENCE_LSTM again, its weights as their codes with their parameters, the
states as variable int8 / int16 tensors and the five intermediates LiteRT's int8 kernel reads
(the fifth holds the hidden state's parameters, the others the gates' pre-activation scales,
read with layer normalization only: written at Q3.12's otherwise). LiteRT runs it with the integer
simulator's arithmetic (npuforge/quant/lstm_rule.py; tests/test_tflite_lstm_int8.py)."""

from __future__ import annotations

import numpy as np

from ..ops.recurrent import SLOTS, lstm_slots
from ..quant.params import QParams
from .tflite_layout import refuse

_FILE_DTYPE = {"W": "int8", "R": "int8", "P": "int8", "p": "int16", "b": "int32", "Pb": "int32", "ln": "int16"}
_TANH = 4  # ActivationFunctionType.TANH
_BIAS_CODES = {"Pb": "bias_P", **{f"b_{g}": f"bias_{g}" for g in "ifco"}}  # input -> its exact codes' role


def sequence_lstm(ex, node) -> None:
    slots = lstm_slots(node)
    a = node.attrs
    x, y = slots["x"], node.outputs[0]
    yq = ex.qp(y)
    inputs = [ex.activation(x)]
    for role in SLOTS[1:]:
        name = slots[role]
        if not name:
            inputs.append(-1)
            continue
        v = ex.g.values[name]
        dtype = _FILE_DTYPE[role.split("_")[0]]
        if not v.is_const or v.quant is None or v.quant.per_channel or v.quant.dtype != dtype:
            refuse(node, f"its input '{name}' is not a constant with one {dtype} scale (as an int8 .tflite gives it)")
        codes = ex.stored(node, _BIAS_CODES[role]) if role in _BIAS_CODES else v.quant.quantize(v.data)
        inputs.append(ex.const(name, codes, dtype, ex.quant(v.quant)))
    time_axis = 0 if a["time_major"] else 1
    batch = ex.dims(x)[1 - time_axis]
    n_cell, n_out = ex.g.values[slots["R_f"]].shape
    cell_q = QParams("int16", np.float32(2.0 ** a["cell_scale_log2"]), 0)
    states = [ex.w.tensor(f"{node.name}::output_state", (batch, n_out), "int8", quant=ex.quant(yq), variable=True),
              ex.w.tensor(f"{node.name}::cell_state", (batch, n_cell), "int16", quant=ex.quant(cell_q),
                          variable=True)]
    scales = a["gate_scales"] or [2.0**-12] * 4
    hidden_q = QParams("int8", np.float32(a["hidden_scale"]), a["hidden_zero_point"])
    intermediates = [ex.new_tensor(f"{node.name}::gate_{g}", (batch, n_cell), QParams("int16", np.float32(s), 0))
                     for g, s in zip("ifco", scales)]
    intermediates.append(ex.new_tensor(f"{node.name}::hidden", (batch, n_cell), hidden_q))
    ex.op("UNIDIRECTIONAL_SEQUENCE_LSTM", inputs[:18] + states + inputs[18:], [ex.activation(y)],
          "UnidirectionalSequenceLSTMOptions", intermediates=intermediates, FusedActivationFunction=_TANH,
          CellClip=float(a["cell_clip"]), ProjClip=float(a["proj_clip"]), TimeMajor=bool(a["time_major"]))
