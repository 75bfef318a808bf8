"""Weight packing: each layer's int8 weights in the order its commands read them (OHWI for
a convolution, HWC for a depthwise one, [N, K] for a fully connected layer), each layer's
block aligned to the target's alignment, optionally compressed.

The compression (codec 1, Rice coding in two streams) is lossless and simple enough for a
hardware decoder: each weight is zigzag-mapped to unsigned (0, -1, 1, -2, ... -> 0, 1, 2,
3, ...) and split as ``u = q * 2^k + r``; ``r`` goes to a fixed-width stream (k bits per
weight, k chosen per chunk of 256 weights, so a chunk is exactly 32 k bytes), ``q`` to a
unary stream (q zeros and a one). Trained weights peak at 0, so a chunk's best k is 4-6
and a weight costs about 7.3 bits instead of 8 (their entropy is about 7.25 bits on
EfficientNet-Lite0's per-channel int8 weights: no lossless code does much better). The two
streams decode without a serial scan: the unary stream's ones are the codeword ends. A
layer keeps the raw bytes (codec 0) when coding would not make it smaller.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError

CHUNK = 256  # weights per Rice parameter
CODEC_RAW, CODEC_RICE = 0, 1


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int16)
    return ((v << 1) ^ (v >> 15)).astype(np.int64)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    return ((u >> 1) ^ -(u & 1)).astype(np.int8)


def encode(weights: np.ndarray) -> tuple[int, bytes]:
    """(codec, bytes) of one layer's int8 weights (flattened in their stored order)."""
    flat = np.ascontiguousarray(weights, np.int8).reshape(-1)
    n = flat.size
    chunks = -(-n // CHUNK)
    u = np.zeros(chunks * CHUNK, np.int64)
    u[:n] = _zigzag(flat)
    u = u.reshape(chunks, CHUNK)
    cost = np.stack([((u >> k) + 1 + k).sum(axis=1) for k in range(8)], axis=1)  # bits per chunk and k
    ks = cost.argmin(axis=1)
    q = (u >> ks[:, None]).reshape(-1)[:n]
    unary = np.zeros(int((q + 1).sum()), np.uint8)
    unary[np.cumsum(q + 1) - 1] = 1
    unary = np.packbits(unary)
    rem = np.zeros(int(32 * ks.sum()), np.uint8)
    starts = np.concatenate([[0], np.cumsum(32 * ks)[:-1]])
    low = (u & ((1 << ks[:, None]) - 1)).astype(np.uint8)
    for k in range(1, 8):
        sel = np.nonzero(ks == k)[0]
        if sel.size:
            bits = np.unpackbits(low[sel][:, :, None], axis=2)[:, :, 8 - k:]  # most significant first
            rem[(starts[sel][:, None] + np.arange(32 * k)).reshape(-1)] = np.packbits(
                bits.reshape(sel.size, CHUNK * k), axis=1).reshape(-1)
    data = int(unary.size).to_bytes(4, "little") + ks.astype(np.uint8).tobytes() + rem.tobytes() + unary.tobytes()
    if len(data) >= n:
        return CODEC_RAW, flat.tobytes()
    return CODEC_RICE, data


def block_problem(codec: int, data: bytes, count: int) -> str | None:
    """Why a weight block does not decode to ``count`` weights (None: it does), from its header and
    lengths alone: the reader checks every block so before anything is decoded or allocated."""
    n = len(data)
    if codec == CODEC_RAW:
        return None if n == count else f"holds {n} bytes, {count} raw weights expected"
    if codec != CODEC_RICE:
        return f"codec {codec} is unknown (0 raw, 1 Rice)"
    chunks = -(-count // CHUNK)
    if n < 4 + chunks:
        return f"is {n} bytes, shorter than the header of {count} Rice-coded weights"
    ks = np.frombuffer(data, np.uint8, chunks, 4).astype(np.int64)
    unary_len = int.from_bytes(data[:4], "little")
    if (ks > 7).any() or 4 + chunks + int(32 * ks.sum()) + unary_len != n:
        return "has Rice parameters that do not match its length"
    if int(np.unpackbits(np.frombuffer(data, np.uint8, unary_len, n - unary_len)).sum()) < count:
        return f"has a unary stream of fewer than {count} codewords"
    return None


def decode(codec: int, data: bytes, count: int) -> np.ndarray:
    """The int8 weights back from (codec, bytes); ``count`` weights."""
    problem = block_problem(codec, data, count)
    if problem:
        raise ModelFormatError(f"weight block {problem}")
    buf = np.frombuffer(data, np.uint8)
    if codec == CODEC_RAW:
        return buf.view(np.int8).copy()
    chunks = -(-count // CHUNK)
    ks = buf[4:4 + chunks].astype(np.int64)
    rem_len = int(32 * ks.sum())
    rem = buf[4 + chunks:4 + chunks + rem_len]
    ends = np.flatnonzero(np.unpackbits(buf[4 + chunks + rem_len:]))
    q = np.diff(np.concatenate([[-1], ends[:count]])) - 1
    low = np.zeros((chunks, CHUNK), np.int64)
    starts = np.concatenate([[0], np.cumsum(32 * ks)[:-1]])
    for k in range(1, 8):
        sel = np.nonzero(ks == k)[0]
        if sel.size:
            packed = rem[(starts[sel][:, None] + np.arange(32 * k)).reshape(-1)].reshape(sel.size, 32 * k)
            bits = np.unpackbits(packed, axis=1).reshape(sel.size, CHUNK, k)
            low[sel] = (bits.astype(np.int64) << np.arange(k - 1, -1, -1)).sum(axis=2)
    u = (q << np.repeat(ks, CHUNK)[:count]) | low.reshape(-1)[:count]
    return _unzigzag(u)


def align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment
