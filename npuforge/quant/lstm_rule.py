"""The int8 LSTM of TFLite (quantization kind "lstm"): UNIDIRECTIONAL_SEQUENCE_LSTM's 8x8_16
kernel (LiteRT's ``lstm_eval.cc``, ``EvalInteger8x8_16``), bit for bit.

An int8 ``.tflite`` LSTM imports as one :class:`~npuforge.ops.recurrent.SequenceLSTM` node
whose weights keep the file's codes and parameters (the unrolled ops of a float LSTM cannot
reproduce this arithmetic: it rescales the input and recurrent products separately, into
int16 with a saturation after each). Per time step, with x and h int8 codes, c the int16
cell state at scale 2^cell_scale:

* gate pre-activations in int16 Q3.12: ``sat16(R(W x + b_eff)) `` then
  ``sat16(R(U h + u_eff) + that)``, and, with peepholes, ``sat16(R(p * c) + that)``; R a
  fixed-point multiplier derived in float32 as LiteRT's Prepare derives it (weight scale
  times input scale over 2^-12), b_eff the bias minus the input zero point times the
  weights' row sums (the same for U with the state's zero point);
* i, f, o by gemmlowp's int16 fixed-point logistic (Q3.12 -> Q0.15), the cell gate by its
  tanh; both are tables of all 65,536 inputs here, computed once by gemmlowp's arithmetic
  (:func:`logistic_q15`, :func:`tanh_q15`); CIFG takes ``i = 32767 - f``;
* ``c = sat16(rdbp(f c, 15) + rdbp(i g, 30 + cell_scale))``, clipped to the cell clip's code;
* ``h = sat8(R_h(o * tanh(c)) + zp_h)`` with tanh read at 15 + cell_scale integer bits (LiteRT's
  tanh takes 0 to 6: with a cell scale of 2^-16, which TF's converter writes for small cell ranges,
  it skips the tanh and multiplies o by the input gate left in its buffer; reproduced, measured) and
  zp_h the hidden state's zero point; with a projection LiteRT subtracts it instead (its
  projection bias adds it back: the same values, saturated at other codes), then
  ``sat8(R_p(P h + p_eff) + zp_y)`` clipped to the projection clip's code.

With layer normalization (int16 coefficients per gate) each gate's pre-activation is held at
its own scale (the file's intermediate tensors 0-3), normalized over the cell units in
integers (a mean and variance with 10 fractional bits, gemmlowp's inverse square root by
Newton-Raphson: :func:`npuforge.quant.gemmlowp.inv_sqrt_multiplier`), scaled by the coefficients, the gate bias
added, and requantized to Q3.12; the biases then stay out of the products.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from ..errors import NpuforgeError, UnsupportedError
from ..sim.int_ops import requantize_fixedpoint, rounding_divide_by_pot
from . import gemmlowp
from .requant import quantize_multiplier

GATES = "ifco"  # LiteRT's order: input, forget, cell, output


# -- gemmlowp's int16 logistic and tanh as tables of every input -------------------------------------

_ALL16 = np.arange(-32768, 32768, dtype=np.int64)


@cache
def logistic_q15(integer_bits: int = 3) -> torch.Tensor:
    """gemmlowp's logistic of every int16 input with ``integer_bits`` integer bits -> Q0.15 (int64)."""
    return torch.from_numpy(gemmlowp.logistic(_ALL16, integer_bits, 16))


@cache
def tanh_q15(integer_bits: int) -> torch.Tensor:
    """gemmlowp's tanh of every int16 input with ``integer_bits`` integer bits (0..6) -> Q0.15."""
    return torch.from_numpy(gemmlowp.tanh(_ALL16, integer_bits, 16))


def _lookup(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return table[x + 32768]


def _layer_norm(pre: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor, mult, shift, guard: int) -> torch.Tensor:
    """LiteRT's integer layer normalization of int16 gate pre-activations (ApplyLayerNorm) -> Q3.12."""
    n = pre.shape[-1]
    total, squares = pre.sum(-1, keepdim=True), (pre * pre).sum(-1, keepdim=True)
    mean = torch.div(total * 1024, n, rounding_mode="trunc")
    variance = torch.div(squares * ((1 << 20) // n) - mean * mean, 1 << 20, rounding_mode="trunc")
    variance = torch.where(variance < 1, guard, variance)
    inv_a, inv_b = gemmlowp.inv_sqrt_multiplier(variance.numpy())
    rescaled = requantize_fixedpoint(1024 * pre - mean, torch.from_numpy(inv_a), torch.from_numpy(inv_b))
    val3 = rescaled * weights + bias
    val4 = torch.div(torch.where(val3 > 0, val3 + 512, val3 - 512), 1024, rounding_mode="trunc")
    return _sat16(requantize_fixedpoint(val4, mult, shift + 12))


# -- the integers: LiteRT's Prepare ----------------------------------------------------------------

_F32 = np.float32


def _multiplier(add, role: str, real) -> None:
    mult, shift = quantize_multiplier(np.float64(real))
    add(f"multiplier_{role}", np.asarray(mult, np.int32))
    add(f"shift_{role}", np.asarray(shift, np.int32))


def quantize_integers(graph, node, add, raw: dict | None = None) -> None:
    """The node's integers as LiteRT's Prepare derives them from the file's parameters: each
    product's multiplier (float32 ratios, as its C++ computes them), the biases with the zero
    points folded in, the clips as codes. ``raw``: value name -> the file's own codes, for
    int32 biases (beyond float32's 24 bits a dequantized bias does not give its code back);
    the biases' codes are also kept as they are (``bias_<gate>``, ``bias_P``) for the export."""
    from ..ops.recurrent import lstm_slots

    slots = lstm_slots(node)
    q = lambda name: graph.values[name].quant  # noqa: E731
    missing = [n for n in node.inputs if n and q(n) is None]
    if missing or q(node.outputs[0]) is None:
        raise UnsupportedError(f"node '{node.name}' (SequenceLSTM): '{(missing or node.outputs)[0]}' has no "
                               f"quantization parameters; npuforge computes this LSTM in int8 only as an int8 "
                               f"TFLite file gives it")
    a = node.attrs
    xq, hq = q(slots["x"]), q(node.outputs[0])
    norm = bool(slots.get("ln_f"))
    hidden_scale = _F32(a["hidden_scale"])
    raw = raw or {}
    codes = lambda name: np.asarray(raw[name] if name in raw else  # noqa: E731
                                    q(name).quantize(graph.values[name].data), np.int64)
    for g in slots["gates"]:
        # each gate's pre-activation scale: the file's intermediate with layer normalization, else Q3.12
        gate_scale = _F32(a["gate_scales"][GATES.index(g)]) if norm else _F32(2.0**-12)
        w, r = slots[f"W_{g}"], slots[f"R_{g}"]
        _multiplier(add, f"x_{g}", _F32(q(w).scale) * _F32(xq.scale) / gate_scale)
        _multiplier(add, f"h_{g}", _F32(q(r).scale) * _F32(hq.scale) / gate_scale)
        bias = codes(slots[f"b_{g}"]) if slots.get(f"b_{g}") else np.zeros(graph.values[w].shape[0], np.int64)
        add(f"bias_{g}", bias.astype(np.int32))
        if norm:  # the bias comes after the normalization
            ln_scale = _F32(q(slots[f"ln_{g}"]).scale)
            _multiplier(add, f"ln_{g}", ln_scale)
            add(f"variance_guard_{g}", np.asarray(max(1, int(_F32(10000) * ln_scale)), np.int32))
            bias = 0
        add(f"bias_x_{g}", (bias - int(xq.zero_point) * codes(w).sum(axis=1)).astype(np.int32))
        add(f"bias_h_{g}", (-int(hq.zero_point) * codes(r).sum(axis=1)).astype(np.int32))
        if slots.get(f"p_{g}"):  # std::pow(2, cell_scale) * weight scale / gate scale, in double, stored as float
            _multiplier(add, f"c_{g}", _F32(2.0 ** a["cell_scale_log2"] * np.float64(_F32(q(slots[f"p_{g}"]).scale))
                                          / np.float64(gate_scale)))
    _multiplier(add, "hidden", _F32(2.0**-30 / np.float64(hidden_scale)))
    if slots.get("P"):
        _multiplier(add, "proj", _F32(q(slots["P"]).scale) * hidden_scale / _F32(hq.scale))
        bias = codes(slots["Pb"]) if slots.get("Pb") else np.zeros(graph.values[slots["P"]].shape[0], np.int64)
        add("bias_P", bias.astype(np.int32))
        add("bias_proj", (bias + int(a["hidden_zero_point"]) * codes(slots["P"]).sum(axis=1)).astype(np.int32))
    cell_clip = int(np.clip(_F32(a["cell_clip"]) / _F32(2.0 ** a["cell_scale_log2"]), -32768, 32767)) \
        if a["cell_clip"] > 0 else 0
    proj_clip = int(np.clip(_F32(a["proj_clip"]) / _F32(hq.scale), -128, 127)) if a["proj_clip"] > 0 else 0
    add("cell_clip", np.asarray(cell_clip, np.int32))
    add("proj_clip", np.asarray(proj_clip, np.int32))


# -- the kernel --------------------------------------------------------------------------------------

def _sat16(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-32768, 32767)


def integer_forward(sim, node, env) -> list:
    from ..ops.recurrent import lstm_slots

    slots = lstm_slots(node)
    a = node.attrs
    ints = {role: torch.from_numpy(sim._int(node, role).astype(np.int64)) for role in node.quant}  # (once)
    codes = lambda name: sim._as_codes(name, env).to(torch.int64)  # noqa: E731
    R = lambda acc, role: requantize_fixedpoint(acc, ints[f"multiplier_{role}"], ints[f"shift_{role}"])  # noqa: E731

    x = codes(slots["x"])
    if a["time_major"]:
        x = x.transpose(0, 1)
    batch, steps = x.shape[:2]
    gates = slots["gates"]
    W = {g: codes(slots[f"W_{g}"]) for g in gates}
    U = {g: codes(slots[f"R_{g}"]) for g in gates}
    peep = {g: codes(slots[f"p_{g}"]) for g in gates if slots.get(f"p_{g}")}
    norm = {g: codes(slots[f"ln_{g}"]) for g in gates if slots.get(f"ln_{g}")}
    proj = codes(slots["P"]) if slots.get("P") else None
    n_cell, n_out = U["f"].shape
    cell_bits = 15 + a["cell_scale_log2"]
    sigmoid, tanh_gate = logistic_q15(3), tanh_q15(3)
    # LiteRT's int16 tanh takes 0 to 6 integer bits; for a cell scale below 2^-15 it leaves its output
    # buffer as it was: the input gate (measured on TF's converter's 2^-16 cell states)
    tanh_cell = tanh_q15(cell_bits) if cell_bits >= 0 else None
    if tanh_cell is None and "i" not in gates:
        raise NpuforgeError(f"node '{node.name}' (SequenceLSTM): a CIFG LSTM with a cell scale of "
                            f"2^{a['cell_scale_log2']}, whose output LiteRT leaves undefined")
    cell_clip, proj_clip = int(ints["cell_clip"]), int(ints["proj_clip"])
    # LiteRT stores o * tanh(c) as code - zp before a projection (whose bias adds zp back), as
    # code + zp when it is the output (measured against LiteRT 2.3.0: the two saturate differently)
    hidden_offset = int(a["hidden_zero_point"]) * (-1 if proj is not None else 1)
    yq = sim._q(node.outputs[0])

    def gate(g, x_t, h, c):
        pre = _sat16(R(x_t @ W[g].T + ints[f"bias_x_{g}"], f"x_{g}"))
        pre = _sat16(R(h @ U[g].T + ints[f"bias_h_{g}"], f"h_{g}") + pre)
        if g in peep:
            # LiteRT's peephole product walks n_output (not n_cell) elements per batch row over the
            # [batch, n_cell] arrays taken as one flat run; the same unless a projection narrows the
            # output. Batch-major input runs one batch row per call (n_batch = 1), time-major all.
            rows = pre.reshape(1 if a["time_major"] else batch, -1).clone()
            cf = c.reshape(rows.shape)
            k = torch.arange(n_out * (batch if a["time_major"] else 1))
            rows[:, k] = _sat16(R(peep[g][k % n_out] * cf[:, k], f"c_{g}") + rows[:, k])
            pre = rows.reshape(pre.shape)
        if g in norm:
            pre = _layer_norm(pre, norm[g], ints[f"bias_{g}"], ints[f"multiplier_ln_{g}"],
                              ints[f"shift_ln_{g}"], int(ints[f"variance_guard_{g}"]))
        return _lookup(tanh_gate if g == "c" else sigmoid, pre)

    h = torch.zeros(batch, n_out, dtype=torch.int64) + int(yq.zero_point)
    c = torch.zeros(batch, n_cell, dtype=torch.int64)
    outs = []
    for t in range(steps):
        x_t = x[:, t]
        i = gate("i", x_t, h, c) if "i" in gates else None
        f = gate("f", x_t, h, c)
        g = gate("c", x_t, h, c)
        c = rounding_divide_by_pot(f * c, 15)
        i = 32767 - f if i is None else i
        c = _sat16(c + _wrap16_t(rounding_divide_by_pot(i * g, 30 + a["cell_scale_log2"])))
        if cell_clip > 0:
            c = c.clamp(-cell_clip, cell_clip)
        o = gate("o", x_t, h, c)
        squashed = _lookup(tanh_cell, c) if tanh_cell is not None else i  # (LiteRT's, see above)
        hidden = (R(o * squashed, "hidden") + hidden_offset).clamp(-128, 127)
        if proj is not None:
            h = (R(hidden @ proj.T + ints["bias_proj"], "proj") + int(yq.zero_point)).clamp(-128, 127)
            if proj_clip > 0:
                h = h.clamp(-proj_clip, proj_clip)
        else:
            h = hidden
        outs.append(h)
    y = torch.stack(outs, 0 if a["time_major"] else 1)
    return [y.to(torch.int8)]


def _wrap16_t(x: torch.Tensor) -> torch.Tensor:
    """The int16 cast of LiteRT's CwiseMul (which cannot overflow for a cell scale of 2^-15 or finer)."""
    return ((x + 32768) & 0xFFFF) - 32768
