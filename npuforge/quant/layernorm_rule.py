"""The integer LayerNormalization, InstanceNormalization and L2Normalize (quantization
kind "layernorm"): decided once by the quantizer, run by the integer simulator.

LayerNormalization normalizes over the axes from ``axis`` on, with a scale and bias
per normalized element; InstanceNormalization over the spatial axes of each
(sample, channel), with a scale and bias per channel. Over the N elements of each
normalized slice, with input codes q (scale ``s_x``) and output scale ``s_y`` /
zero point ``zp_y``:

1. ``S = sum(q)``, ``c = N * q - S``: N times the centred code, exact (the zero point cancels);
2. ``W = N * sum(q^2) - S^2 = sum(c^2) / N``, so the variance in codes is ``W / N^2``;
   ``E = round(eps / s_x^2 * N^2)`` carries epsilon on the same scale (at least 1, so a
   constant slice divides by it; at most 2^60);
3. ``D = W + E``, brought to 23 bits or fewer by ``h = #{j in 1..20: D >= 2^(21 + 2j)}``:
   ``D_h = D // 4^h``; then ``r = isqrt(2^60 // D_h)`` (about 19 significant bits whatever N
   and the slice's spread: the shift by h is what makes that so) and
   ``u = floor(c * r / 2^(h + 30 - P/2))``, with ``P`` the largest even number keeping
   ``N << P`` below 2^62: ``u / 2^(P/2)`` is the normalized value and
   ``|u| <= 2^(P/2) * sqrt(N)`` (a single ``c^2`` never exceeds ``N * W``);
4. ``y = floor((u * G + B + 2^(T-1)) / 2^T) + zp_y``, saturated, with per-element
   ``G = round(scale / s_y * 2^F)``, ``B = round(bias / s_y * 2^T)``, ``T = P/2 + F`` and
   the largest ``F <= 24`` that keeps the whole sum below 2^53 (:func:`output_bound`), so that
   float64 arithmetic computes it exactly (the fast simulator's), where that leaves ``F >= 12``
   (G's rounding then moves y by at most ``|u| / 2^(P/2) / 2^13`` of an output step: 1/2^13
   per unit of the normalized value); else the largest that keeps every term below 2^61.

L2Normalize (``x / max(||x||, eps)``) takes the same steps uncentred: ``c = q - zp_x``,
``W = sum(c^2)`` and ``D = max(W, E)`` with ``E = round((eps / s_x)^2)`` (at least 1),
scale 1 and bias 0.

All of it is int64 arithmetic; the integer square root is exact (a float64 estimate
corrected by one step each way). With input codes of magnitude at most m, ``W`` and
``c * r`` stay inside int64 while ``N * m < 2^30.5``: slices of up to 5.8 million 8-bit
codes, or 46,340 16-bit ones; a larger 8-bit normalization is kept in float.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import NpuforgeError

MAX_F = 24
LIMIT = 61  # every intermediate stays below 2^61 (and so their sum below 2^63)
NUMERATOR_BITS = 60  # r = isqrt(2^60 // D_h)
SHIFT_LIMITS = [1 << (21 + 2 * j) for j in range(1, 21)]  # h counts the limits D reaches (D < 2^62)


FLOAT64_SUMS = 1 << 53  # every integer below it is a float64
FLOAT64_MIN_F = 12  # the fewest fractional bits of G for a float64 output sum (else: 2^61, int64)


def u_max(n: int) -> int:
    """A bound on |u|: 2^(P/2) sqrt(N), with room for D_h's floor (2^-21) and isqrt's."""
    return ((math.isqrt(n) + 2) << (_p_bits(n) // 2)) * 2


def output_bound(u_bound: int, scale: np.ndarray, bias: np.ndarray, t: int) -> int:
    """|u G + B + 2^(T-1)| at most, for |u| <= ``u_bound`` and the integers G, B, T of
    :func:`quantize_integers`."""
    return u_bound * int(np.abs(scale).max(initial=0)) + int(np.abs(bias).max(initial=0)) + (1 << (t - 1))


def fits(n: int, magnitude: int = 255) -> bool:
    """Whether a slice of ``n`` codes of at most ``magnitude`` keeps the rule inside int64:
    ``W <= (N m)^2`` below 2^61 (``c * r`` then stays below 2^62)."""
    return (n * magnitude) ** 2 < 1 << LIMIT


def shift_of(d: torch.Tensor) -> torch.Tensor:
    """h: how many times D must be divided by 4 to have at most 23 bits (int64 tensors)."""
    return (d.unsqueeze(-1) >= torch.tensor(SHIFT_LIMITS, dtype=torch.int64)).sum(dim=-1)


def centred(node) -> bool:
    """LayerNormalization and InstanceNormalization subtract the mean; L2Normalize does not."""
    return node.op != "L2Normalize"


def _geometry(graph, node) -> tuple[tuple, int, tuple]:
    """(normalized axes, N, the shape scale and bias broadcast to against the input)."""
    shape = graph.values[node.inputs[0]].shape
    if node.op == "InstanceNormalization":
        axes, params = tuple(range(2, len(shape))), (shape[1],) + (1,) * (len(shape) - 2)
    elif node.op == "L2Normalize":
        axes, params = tuple(sorted(a % len(shape) for a in node.attrs["axes"])), ()
    else:
        axis = node.attrs["axis"] % len(shape)
        axes, params = tuple(range(axis, len(shape))), tuple(shape[axis:])
    dims = [shape[a] for a in axes]
    if not all(isinstance(d, int) for d in dims + list(params)):
        raise NpuforgeError(f"node '{node.name}' ({node.op}): the normalized axes {dims} and parameters "
                            f"{list(params)} must be static to quantize it")
    return axes, int(np.prod(dims)), params


def _parameter(graph, node, k: int, shape: tuple) -> np.ndarray:
    if not centred(node):  # L2Normalize: scale 1, bias 0
        return np.full(shape, 1.0 if k == 1 else 0.0)
    if len(node.inputs) <= k or not node.inputs[k]:
        return np.zeros(shape)
    data = np.asarray(graph.values[node.inputs[k]].data, np.float64)
    return np.broadcast_to(data.reshape(shape) if node.op == "InstanceNormalization" else data, shape)


def _p_bits(n: int) -> int:
    p = 62 - n.bit_length()
    return p - (p % 2)


def down_shift(n: int) -> int:
    """From r's 2^30 to u's 2^(P/2) fixed point."""
    return NUMERATOR_BITS // 2 - _p_bits(n) // 2


def quantize_integers(graph, node, add) -> None:
    """Store E, G, B and the shifts of one LayerNormalization node (``add(role, array)``)."""
    xp, yp = graph.values[node.inputs[0]].quant, graph.values[node.outputs[0]].quant
    _, n, params = _geometry(graph, node)
    scale, bias = _parameter(graph, node, 1, params), _parameter(graph, node, 2, params)
    magnitude = max(abs(xp.qmin), abs(xp.qmax)) if centred(node) else xp.qmax - xp.qmin  # of q, or of q - zp
    if not fits(n, magnitude):
        raise NpuforgeError(f"node '{node.name}' ({node.op}): {n} input codes of up to {magnitude} per slice "
                            f"overflow the integer rule's int64 sums; keep it in float (keep_float) or "
                            f"leave its input in 8 bits")
    s_x, s_y = float(xp.scale), float(yp.scale)
    if centred(node):  # sqrt(var + eps): added to W = N^2 var
        eps_codes = node.attrs["epsilon"] / (s_x * s_x) * n ** 2
    else:  # max(||x||, eps): a floor under W = ||x||^2 / s_x^2
        eps_codes = (node.attrs["epsilon"] / s_x) ** 2
    if math.isnan(eps_codes):
        raise NpuforgeError(f"node '{node.name}' ({node.op}): epsilon {node.attrs['epsilon']} is not a number; "
                            f"fix the model's attribute")
    # clamped before rounding: an epsilon of inf (or 1e300) is 2^60, which outweighs every W
    eps = round(min(max(1.0, eps_codes), float(1 << 60)))
    half_p = _p_bits(n) // 2
    g_max = max(float(np.abs(scale).max()) / s_y, 1e-30)
    b_max = float(np.abs(bias).max()) / s_y
    # |c r G| <= 2^(P/2) sqrt(N) |scale|/s_y 2^F and |B| = |bias|/s_y 2^(P/2+F), each below 2^LIMIT
    f = min(MAX_F, math.floor(LIMIT - half_p - 0.5 * math.log2(n) - math.log2(g_max)))
    if b_max > 0:
        f = min(f, math.floor(LIMIT - half_p - math.log2(b_max)))
    if f < 8:
        raise NpuforgeError(f"node '{node.name}' ({node.op}): its scale and bias over the output step "
                            f"leave {f} fractional bits; keep it in float (keep_float)")

    def integers(f: int) -> tuple:
        return (np.rint(scale * (2.0 ** f / s_y)).astype(np.int64),
                np.rint(bias * (2.0 ** (half_p + f) / s_y)).astype(np.int64))

    for f64 in range(f, FLOAT64_MIN_F - 1, -1):
        if output_bound(u_max(n), *integers(f64), half_p + f64) < FLOAT64_SUMS:
            f = f64
            break
    g_int, b_int = integers(f)
    add("scale", g_int)
    add("bias", b_int)
    add("epsilon", np.asarray(eps, np.int64))
    add("shift", np.asarray(half_p + f, np.int64))


def isqrt(a: torch.Tensor) -> torch.Tensor:
    """floor(sqrt(a)) of non-negative int64 values below 2^62, exactly."""
    r = torch.sqrt(a.to(torch.float64)).floor().to(torch.int64)
    r = torch.where(r * r > a, r - 1, r)
    return torch.where((r + 1) * (r + 1) <= a, r + 1, r)


def integer_forward(sim, node, env) -> list:
    q = sim._as_codes(node.inputs[0], env).to(torch.int64)
    dims, n, _ = _geometry(sim.graph, node)
    e = int(sim._int(node, "epsilon"))
    if centred(node):
        total = q.sum(dim=dims, keepdim=True)
        c = n * q - total
        d = n * (q * q).sum(dim=dims, keepdim=True) - total * total + e
    else:
        c = q - int(sim._q(node.inputs[0]).zero_point)
        d = torch.clamp((c * c).sum(dim=dims, keepdim=True), min=e)
    h = shift_of(d)
    r = isqrt((1 << NUMERATOR_BITS) // (d >> (2 * h)))
    u = (c * r) >> (h + down_shift(n))  # arithmetic shift: floor
    g = torch.from_numpy(sim._int(node, "scale"))
    b = torch.from_numpy(sim._int(node, "bias"))
    t = int(sim._int(node, "shift"))
    y = (u * g + b + (1 << (t - 1))) >> t
    p = sim._q(node.outputs[0])
    return [sim._store(y + int(p.zero_point), p)]
