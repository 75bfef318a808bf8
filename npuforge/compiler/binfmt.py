"""The ``.npub`` program format (version 1), documented in docs/compiler.md.

Little-endian throughout. A 32-byte header (magic ``NPUB``, major / minor version, the
section count, the file size, the CRC-32 of everything after the header), a table of
sections (kind, offset, size, CRC-32 each), then the sections:

* TENSORS: one 36-byte record per tensor: dtype, height, width, channels, SRAM offset,
  rows held (a rolling buffer holds fewer than its height), scale, zero point, name.
* COMMANDS: one 76-byte record per command: opcode, input count, op index, the output
  rows of its stripe (first row and count), parameter and weight blocks (offset, length,
  codec, decoded length), the output tensor and its SRAM offset, up to three input
  tensors and their SRAM offsets.
* IO: the program's inputs and outputs: direction, tensor, rank and the NCHW shape.
* PARAMS: parameter blocks, one per operation: entries of (tag, kind, count, int32 values).
* WEIGHTS: packed weight blocks (npuforge/compiler/weights.py), aligned.
* STRINGS: tensor names, NUL-separated UTF-8.
* META: a JSON object (target, summary, preprocessing): read by tools, never executed.

Readers refuse another major version, a bad magic, size or checksum, a truncated section
and any field out of range, each with one line.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError

MAGIC = b"NPUB"
VERSION = (1, 0)
HEADER = struct.Struct("<4sHHIIII8x")  # magic, major, minor, sections, file size, crc of the rest, flags
SECTION = struct.Struct("<IIII")  # kind, offset, size, crc32
TENSOR = struct.Struct("<BxxxIIIIIfiI")  # dtype, h, w, c, offset, ring rows, scale, zero point, name index
COMMAND = struct.Struct("<BBH" + "I" * 8 + "BxxxHxxI" + "HxxI" * 3 + "4x")
IO = struct.Struct("<BBHI" + "I" * 4)  # direction (0 in, 1 out), rank, tensor, reserved, dims
PARAM_ENTRY = struct.Struct("<HBxI")  # tag, kind (0 scalar, 1 array), count

SECTIONS = ("TENSORS", "COMMANDS", "IO", "PARAMS", "WEIGHTS", "STRINGS", "META")
DTYPES = ("int8", "uint8", "int16")
OPCODES = ("conv", "depthwise", "fully_connected", "add", "sub", "mul", "avgpool", "global_avgpool", "maxpool",
           "lut", "concat", "resize_bilinear")
PARAM_TAGS = ("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w", "pad_top", "pad_left",
              "group", "zp_in", "zp_out", "bias", "multiplier", "shift", "act_min", "act_max", "single_rounding",
              "multiplier_neg", "shift_neg", "zp_in0", "zp_in1", "mode", "left_shift", "multiplier0", "shift0",
              "multiplier1", "shift1", "multiplier_out", "shift_out", "count", "divisor", "extra_bits",
              "code_average", "qmin", "table", "code_shift", "row_lo", "row_hi", "row_w0", "row_w1", "col_lo",
              "col_hi", "col_w0", "col_w1")
NO_TENSOR = 0xFFFF


@dataclass
class TensorRecord:
    name: str
    dtype: str
    h: int
    w: int
    c: int
    offset: int
    ring_rows: int
    scale: float
    zero_point: int

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "int16" else 1

    @property
    def row_bytes(self) -> int:
        return self.w * self.c * self.itemsize


@dataclass
class CommandRecord:
    kind: str
    op: int
    row0: int
    rows: int
    params: tuple  # (offset, length) in PARAMS
    weights: tuple  # (offset, length, codec, count) in WEIGHTS
    output: tuple  # (tensor, SRAM offset)
    inputs: list  # [(tensor, SRAM offset)]


@dataclass
class ProgramImage:
    """A program as read back from its bytes: what the program simulator executes."""
    version: tuple
    tensors: list
    commands: list
    inputs: list  # [(tensor, nchw shape)]
    outputs: list
    params: bytes
    weights: bytes
    meta: dict = field(default_factory=dict)


# -- parameter blocks ---------------------------------------------------------------------------
def encode_params(params: dict, where: str) -> bytes:
    out = bytearray()
    for name, value in params.items():
        arr = np.asarray(value)
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise ModelFormatError(f"{where}: parameter '{name}' does not fit int32")
        kind = 0 if arr.ndim == 0 else 1
        flat = arr.astype("<i4").reshape(-1)
        out += PARAM_ENTRY.pack(PARAM_TAGS.index(name), kind, flat.size) + flat.tobytes()
    return bytes(out)


def decode_params(data: bytes) -> dict:
    params, pos = {}, 0
    while pos < len(data):
        if pos + PARAM_ENTRY.size > len(data):
            raise ModelFormatError("parameter block is truncated")
        tag, kind, count = PARAM_ENTRY.unpack_from(data, pos)
        pos += PARAM_ENTRY.size
        if tag >= len(PARAM_TAGS) or kind > 1 or pos + 4 * count > len(data):
            raise ModelFormatError(f"parameter block has a bad entry (tag {tag}, kind {kind}, count {count})")
        arr = np.frombuffer(data, "<i4", count, pos).astype(np.int64)
        pos += 4 * count
        params[PARAM_TAGS[tag]] = int(arr[0]) if kind == 0 else arr
    return params


# -- writing -----------------------------------------------------------------------------------------
def write_program(tensors: list[TensorRecord], commands: list[CommandRecord], inputs, outputs, params: bytes,
                  weights: bytes, meta: dict) -> bytes:
    names = b"\0".join(t.name.encode() for t in tensors)
    tensor_bytes = b"".join(TENSOR.pack(DTYPES.index(t.dtype), t.h, t.w, t.c, t.offset, t.ring_rows, t.scale,
                                        t.zero_point, k) for k, t in enumerate(tensors))
    cmd_bytes = bytearray()
    for c in commands:
        ins = list(c.inputs) + [(NO_TENSOR, 0)] * (3 - len(c.inputs))
        cmd_bytes += COMMAND.pack(OPCODES.index(c.kind), len(c.inputs), 0, c.op, c.row0, c.rows, *c.params,
                                  c.weights[0], c.weights[1], c.weights[3], c.weights[2], c.output[0],
                                  c.output[1], *[v for pair in ins for v in pair])
    io = bytearray()
    for direction, items in ((0, inputs), (1, outputs)):
        for tensor, shape in items:
            dims = list(shape) + [0] * (4 - len(shape))
            io += IO.pack(direction, len(shape), tensor, 0, *dims)
    blobs = [tensor_bytes, bytes(cmd_bytes), bytes(io), params, weights, names,
             json.dumps(meta, sort_keys=True).encode()]
    table_size = SECTION.size * len(blobs)
    pos = HEADER.size + table_size
    table, body = bytearray(), bytearray()
    for kind, blob in enumerate(blobs):
        pad = (-pos) % 16
        body += b"\0" * pad
        pos += pad
        table += SECTION.pack(kind, pos, len(blob), zlib.crc32(blob))
        body += blob
        pos += len(blob)
    rest = bytes(table) + bytes(body)
    header = HEADER.pack(MAGIC, *VERSION, len(blobs), HEADER.size + len(rest), zlib.crc32(rest), 0)
    return header + rest


# -- reading --------------------------------------------------------------------------------------------
def read_program(data: bytes, where: str = "program") -> ProgramImage:
    if len(data) < HEADER.size:
        raise ModelFormatError(f"{where}: {len(data)} bytes is too short for an .npub program (truncated?)")
    magic, major, minor, nsec, size, crc, _ = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ModelFormatError(f"{where}: not an .npub program (magic {magic!r}, expected {MAGIC!r})")
    if major != VERSION[0]:
        raise ModelFormatError(f"{where}: .npub version {major}.{minor}; this npuforge reads version "
                               f"{VERSION[0]}.x (recompile the model)")
    if size != len(data):
        raise ModelFormatError(f"{where}: the header says {size} bytes, the file has {len(data)} (truncated?)")
    if zlib.crc32(data[HEADER.size:]) != crc:
        raise ModelFormatError(f"{where}: checksum mismatch; the file is corrupt")
    if nsec < len(SECTIONS) or HEADER.size + SECTION.size * nsec > len(data):
        raise ModelFormatError(f"{where}: {nsec} sections, expected {len(SECTIONS)}")
    blobs = {}
    for k in range(nsec):
        kind, off, length, sec_crc = SECTION.unpack_from(data, HEADER.size + SECTION.size * k)
        if off + length > len(data) or zlib.crc32(data[off:off + length]) != sec_crc:
            raise ModelFormatError(f"{where}: section {k} is out of bounds or corrupt")
        if kind < len(SECTIONS):
            blobs[SECTIONS[kind]] = data[off:off + length]
    try:
        return _parse(blobs, (major, minor))
    except (struct.error, ValueError, IndexError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{where}: malformed program ({e})") from None


def _records(blob: bytes, rec: struct.Struct, what: str):
    if len(blob) % rec.size:
        raise ModelFormatError(f"{what} section is {len(blob)} bytes, not a multiple of {rec.size}")
    return [rec.unpack_from(blob, k * rec.size) for k in range(len(blob) // rec.size)]


def _parse(blobs: dict, version) -> ProgramImage:
    names = blobs["STRINGS"].decode().split("\0")
    tensors = []
    for dtype, h, w, c, off, ring, scale, zp, name in _records(blobs["TENSORS"], TENSOR, "TENSORS"):
        if dtype >= len(DTYPES) or not 0 < ring <= h or name >= len(names):
            raise ModelFormatError(f"tensor record {len(tensors)} is out of range")
        tensors.append(TensorRecord(names[name], DTYPES[dtype], h, w, c, off, ring, scale, zp))
    commands = []
    for rec in _records(blobs["COMMANDS"], COMMAND, "COMMANDS"):
        opcode, nin, _, op, row0, rows, poff, plen, woff, wlen, wcount, codec, out, out_off = rec[:14]
        pairs = [(rec[14 + 2 * k], rec[15 + 2 * k]) for k in range(nin)]
        if opcode >= len(OPCODES) or nin > 3 or out >= len(tensors) or any(t >= len(tensors) for t, _ in pairs):
            raise ModelFormatError(f"command {len(commands)} is out of range")
        if poff + plen > len(blobs["PARAMS"]) or woff + wlen > len(blobs["WEIGHTS"]):
            raise ModelFormatError(f"command {len(commands)} points past its parameter or weight section")
        if rows == 0 or row0 + rows > tensors[out].h:
            raise ModelFormatError(f"command {len(commands)} writes rows {row0}..{row0 + rows} of a "
                                   f"{tensors[out].h}-row tensor")
        commands.append(CommandRecord(OPCODES[opcode], op, row0, rows, (poff, plen), (woff, wlen, codec, wcount),
                                      (out, out_off), pairs))
    inputs, outputs = [], []
    for direction, rank, tensor, _, *dims in _records(blobs["IO"], IO, "IO"):
        if tensor >= len(tensors) or rank > 4:
            raise ModelFormatError("an input / output descriptor is out of range")
        (inputs if direction == 0 else outputs).append((tensor, tuple(dims[:rank])))
    return ProgramImage(version, tensors, commands, inputs, outputs, blobs["PARAMS"], blobs["WEIGHTS"],
                        json.loads(blobs["META"].decode() or "{}"))
