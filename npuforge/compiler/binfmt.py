"""The ``.npub`` program format (version 2.0), documented in docs/compiler.md.

Little-endian throughout. A 32-byte header (magic ``NPUB``, major / minor version, the
section count, the file size, the CRC-32 of everything after the header), a table of
sections (kind, offset, size, CRC-32 each), then the sections:

* TENSORS: one 36-byte record per tensor: dtype, height, width, channels, SRAM offset,
  rows held (a rolling buffer holds fewer than its height), scale, zero point, name.
* COMMANDS: one record per command: a 48-byte head (opcode, input count, op index, the
  output rows of its stripe (first row and count), parameter and weight blocks (offset,
  length, codec, decoded length), the output tensor and its SRAM offset), then 8 bytes per
  input (tensor, SRAM offset): any number of inputs up to 255.
* IO: the program's inputs and outputs: direction, tensor, rank and the NCHW shape.
* PARAMS: parameter blocks, one per operation: entries of (tag, kind, count, int32 values).
* WEIGHTS: packed weight blocks (npuforge/compiler/weights.py), aligned.
* STRINGS: tensor names, NUL-separated UTF-8.
* META: a JSON object (target, summary, preprocessing): read by tools, never executed.

Version 1.0 held three inputs in a fixed 76-byte command record; 2.0 lists any number, which a
1.x reader would misread, hence a major version. Reading checks everything before anything is
computed or allocated, in two steps: :func:`read_program` the layout (header, checksums, every
section present once, every record, count, offset and length inside its section, every tensor
reference in range), then :func:`npuforge.compiler.validate.validate` what the program
simulator relies on (dimensions, SRAM addresses, parameter blocks, weight blocks, IO shapes,
META). A failure is one line naming the file, the section, the record and the field.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError, UnsupportedError

MAGIC = b"NPUB"
VERSION = (2, 0)
HEADER = struct.Struct("<4sHHIIII8x")  # magic, major, minor, sections, file size, crc of the rest, flags
SECTION = struct.Struct("<IIII")  # kind, offset, size, crc32
# dtype, memory (0 SRAM, 1 DRAM: a tensor spilled), h, w, c, offset in its memory, ring rows, scale, zero point,
# name index
TENSOR = struct.Struct("<BBxxIIIIIfiI")
MEMORIES = ("SRAM", "DRAM")
# a command's head: opcode, input count, reserved, op index, first row, rows, params (offset, length),
# weights (offset, length, decoded count), codec, output tensor, its SRAM offset; INPUT per input follows
COMMAND = struct.Struct("<BBH" + "I" * 8 + "BxxxHxxI")
INPUT = struct.Struct("<HxxI")  # tensor, SRAM offset
IO = struct.Struct("<BBHI" + "I" * 4)  # direction (0 in, 1 out), rank, tensor, reserved, dims
PARAM_ENTRY = struct.Struct("<HBxI")  # tag, kind (0 scalar, 1 array, 2 bytes), count (of values or bytes)

SECTIONS = ("TENSORS", "COMMANDS", "IO", "PARAMS", "WEIGHTS", "STRINGS", "META")
# codes, and (CPU partitions, token ids) the values a node kept in float or computes as indices
DTYPES = ("int8", "uint8", "int16", "float32", "int32", "int64")
DTYPE_BYTES = {"int8": 1, "uint8": 1, "int16": 2, "float32": 4, "int32": 4, "int64": 8}
QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}  # the codes each dtype holds
# NPU operations with kernels of their own (npuforge/compiler/kernels.py), then the node commands:
# each runs the IR node its parameter block holds with the integer simulator's kernel for it
# (npuforge/compiler/cpu.py), whole tensors in and out; "cpu" on the host CPU, the others on an NPU
# whose target lists them
KERNEL_OPCODES = ("conv", "depthwise", "fully_connected", "add", "sub", "mul", "avgpool", "global_avgpool",
                  "maxpool", "lut", "concat", "resize_bilinear")
NODE_OPCODES = ("cpu", "transpose", "matmul", "softmax", "normalization", "gather", "slice", "pad", "elementwise",
                "reduce")
OPCODES = KERNEL_OPCODES + NODE_OPCODES
PARAM_TAGS = ("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w", "pad_top", "pad_left",
              "group", "zp_in", "zp_out", "bias", "multiplier", "shift", "act_min", "act_max", "single_rounding",
              "multiplier_neg", "shift_neg", "zp_in0", "zp_in1", "mode", "left_shift", "multiplier0", "shift0",
              "multiplier1", "shift1", "multiplier_out", "shift_out", "count", "divisor", "extra_bits",
              "code_average", "qmin", "table", "code_shift", "row_lo", "row_hi", "row_w0", "row_w1", "col_lo",
              "col_hi", "col_w0", "col_w1", "node", "output_index")
MAX_INPUTS = 255  # a command's input count is a u8
MAX_TENSORS = 0x10000  # tensor references are u16


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
    memory: int = 0  # 0 SRAM, 1 DRAM (MEMORIES)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

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
    blocks: dict = field(default_factory=dict)  # (offset, length) in PARAMS -> decoded parameter block
    arena: int = 0  # bytes of SRAM the program addresses
    dram_arena: int = 0  # bytes of DRAM its spilled tensors take
    nodes: dict = field(default_factory=dict)  # a node command's 'node' bytes -> its one-node IR graph


# -- parameter blocks ---------------------------------------------------------------------------
def encode_params(params: dict, where: str) -> bytes:
    out = bytearray()
    for name, value in params.items():
        if isinstance(value, bytes):  # a node command's IR node (padded to whole int32 words)
            out += PARAM_ENTRY.pack(PARAM_TAGS.index(name), 2, len(value)) + value + b"\0" * ((-len(value)) % 4)
            continue
        arr = np.asarray(value)
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise ModelFormatError(f"{where}: parameter '{name}' does not fit int32")
        kind = 0 if arr.ndim == 0 else 1
        flat = arr.astype("<i4").reshape(-1)
        out += PARAM_ENTRY.pack(PARAM_TAGS.index(name), kind, flat.size) + flat.tobytes()
    return bytes(out)


def decode_params(data: bytes, where: str = "parameter block") -> dict:
    """{name: int (a scalar entry) or int64 array}; ``where`` names the block in errors."""
    params, pos = {}, 0
    while pos < len(data):
        if pos + PARAM_ENTRY.size > len(data):
            raise ModelFormatError(f"{where}: truncated entry at byte {pos} of {len(data)}")
        tag, kind, count = PARAM_ENTRY.unpack_from(data, pos)
        pos += PARAM_ENTRY.size
        size = count + (-count) % 4 if kind == 2 else 4 * count
        if tag >= len(PARAM_TAGS) or kind > 2 or pos + size > len(data) or (kind == 0 and count != 1):
            raise ModelFormatError(f"{where}: bad entry at byte {pos - PARAM_ENTRY.size} (tag {tag}, kind {kind}, "
                                   f"count {count}, {len(data) - pos} bytes left)")
        if kind == 2:
            params[PARAM_TAGS[tag]] = bytes(data[pos:pos + count])
            pos += size
            continue
        arr = np.frombuffer(data, "<i4", count, pos).astype(np.int64)
        pos += 4 * count
        params[PARAM_TAGS[tag]] = int(arr[0]) if kind == 0 else arr
    return params


# -- writing -----------------------------------------------------------------------------------------
def write_program(tensors: list[TensorRecord], commands: list[CommandRecord], inputs, outputs, params: bytes,
                  weights: bytes, meta: dict) -> bytes:
    if len(tensors) > MAX_TENSORS:
        raise UnsupportedError(f"{len(tensors)} tensors; an .npub program holds at most {MAX_TENSORS}")
    names = b"\0".join(t.name.encode() for t in tensors)
    tensor_bytes = b"".join(TENSOR.pack(DTYPES.index(t.dtype), t.memory, t.h, t.w, t.c, t.offset, t.ring_rows,
                                        t.scale, t.zero_point, k) for k, t in enumerate(tensors))
    cmd_bytes = bytearray()
    for c in commands:
        if len(c.inputs) > MAX_INPUTS:
            raise UnsupportedError(f"a {c.kind} of {len(c.inputs)} inputs; an NPU command takes at most {MAX_INPUTS}")
        cmd_bytes += COMMAND.pack(OPCODES.index(c.kind), len(c.inputs), 0, c.op, c.row0, c.rows, *c.params,
                                  c.weights[0], c.weights[1], c.weights[3], c.weights[2], c.output[0], c.output[1])
        cmd_bytes += b"".join(INPUT.pack(t, off) for t, off in c.inputs)
    io = bytearray()
    for direction, items in ((0, inputs), (1, outputs)):
        for tensor, shape in items:
            dims = list(shape) + [0] * (4 - len(shape))
            io += IO.pack(direction, len(shape), tensor, 0, *dims)
    blobs = [tensor_bytes, bytes(cmd_bytes), bytes(io), params, weights, names,
             json.dumps(meta, sort_keys=True).encode()]
    return assemble(list(enumerate(blobs)))


def assemble(sections: list) -> bytes:
    """The file of these (kind, bytes) sections: header, section table, each section 16-byte aligned,
    every checksum computed."""
    pos = HEADER.size + SECTION.size * len(sections)
    table, body = bytearray(), bytearray()
    for kind, blob in sections:
        pad = (-pos) % 16
        body += b"\0" * pad
        pos += pad
        table += SECTION.pack(kind, pos, len(blob), zlib.crc32(blob))
        body += blob
        pos += len(blob)
    rest = bytes(table) + bytes(body)
    return HEADER.pack(MAGIC, *VERSION, len(sections), HEADER.size + len(rest), zlib.crc32(rest), 0) + rest


# -- reading --------------------------------------------------------------------------------------------
def read_program(data: bytes, where: str = "program") -> ProgramImage:
    """The program in ``data``, every field checked (``where`` names it in the one-line errors)."""
    from .validate import validate

    version, blobs = _sections(data, where)
    image = _parse(blobs, version, where)
    validate(image, where)
    return image


def _sections(data: bytes, where: str) -> tuple[tuple, dict]:
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
    table_end = HEADER.size + SECTION.size * nsec
    if table_end > len(data):
        raise ModelFormatError(f"{where}: header: {nsec} sections; a {len(data)}-byte file has no room for their table")
    blobs = {}
    for k in range(nsec):  # kinds past META: a later minor version's sections, which this reader ignores
        kind, off, length, sec_crc = SECTION.unpack_from(data, HEADER.size + SECTION.size * k)
        name = SECTIONS[kind] if kind < len(SECTIONS) else f"kind {kind}"
        if off < table_end or off + length > len(data):
            raise ModelFormatError(f"{where}: section table entry {k} ({name}): bytes {off}..{off + length} lie "
                                   f"outside the sections ({table_end}..{len(data)})")
        if zlib.crc32(data[off:off + length]) != sec_crc:
            raise ModelFormatError(f"{where}: section table entry {k} ({name}): checksum mismatch; the file is corrupt")
        if name in blobs:
            raise ModelFormatError(f"{where}: section table entry {k}: a second {name} section")
        if kind < len(SECTIONS):
            blobs[name] = data[off:off + length]
    missing = [s for s in SECTIONS if s not in blobs]
    if missing:
        raise ModelFormatError(f"{where}: no {missing[0]} section (a program has {', '.join(SECTIONS)})")
    return (major, minor), blobs


def _records(blob: bytes, rec: struct.Struct, what: str, where: str):
    if len(blob) % rec.size:
        raise ModelFormatError(f"{where}: {what} section is {len(blob)} bytes, not a multiple of its {rec.size}-byte "
                               f"records")
    return [rec.unpack_from(blob, k * rec.size) for k in range(len(blob) // rec.size)]


def _parse(blobs: dict, version, where: str) -> ProgramImage:
    try:
        names = blobs["STRINGS"].decode().split("\0")
    except UnicodeDecodeError as e:
        raise ModelFormatError(f"{where}: STRINGS: not UTF-8 text ({e.reason} at byte {e.start})") from None
    tensors = []
    for k, (dtype, memory, h, w, c, off, ring, scale, zp, name) in enumerate(_records(blobs["TENSORS"], TENSOR,
                                                                                          "TENSORS", where)):
        if memory >= len(MEMORIES):
            raise ModelFormatError(f"{where}: TENSORS record {k}: memory {memory} is unknown (0 SRAM, 1 DRAM)")
        if dtype >= len(DTYPES):
            raise ModelFormatError(f"{where}: TENSORS record {k}: dtype {dtype} is unknown (0..{len(DTYPES) - 1}: "
                                   f"{', '.join(DTYPES)})")
        if name >= len(names):
            raise ModelFormatError(f"{where}: TENSORS record {k}: name index {name}; STRINGS holds {len(names)} names")
        tensors.append(TensorRecord(names[name], DTYPES[dtype], h, w, c, off, ring, scale, zp, memory))
    if len(tensors) > MAX_TENSORS:
        raise ModelFormatError(f"{where}: TENSORS: {len(tensors)} records; tensor references reach {MAX_TENSORS}")
    commands = _commands(blobs, tensors, where)
    inputs, outputs = [], []
    for k, (direction, rank, tensor, _, *dims) in enumerate(_records(blobs["IO"], IO, "IO", where)):
        if direction > 1 or tensor >= len(tensors) or rank > 4:
            raise ModelFormatError(f"{where}: IO record {k}: direction {direction}, tensor {tensor}, rank {rank}; "
                                   f"expected direction 0 or 1, a tensor below {len(tensors)}, rank at most 4")
        (inputs if direction == 0 else outputs).append((tensor, tuple(dims[:rank])))
    return ProgramImage(version, tensors, commands, inputs, outputs, blobs["PARAMS"], blobs["WEIGHTS"],
                        _meta(blobs["META"], where))


def _commands(blobs: dict, tensors: list, where: str) -> list[CommandRecord]:
    blob, commands, pos = blobs["COMMANDS"], [], 0
    nparams, nweights = len(blobs["PARAMS"]), len(blobs["WEIGHTS"])
    while pos < len(blob):
        cmd = f"{where}: COMMANDS command {len(commands)}"
        if pos + COMMAND.size > len(blob):
            raise ModelFormatError(f"{cmd}: truncated ({len(blob) - pos} bytes left of a {COMMAND.size}-byte record)")
        opcode, nin, _, op, row0, rows, poff, plen, woff, wlen, wcount, codec, out, out_off = \
            COMMAND.unpack_from(blob, pos)
        pos += COMMAND.size
        if pos + INPUT.size * nin > len(blob):
            raise ModelFormatError(f"{cmd}: input count {nin}; the section ends {len(blob) - pos} bytes on")
        pairs = [INPUT.unpack_from(blob, pos + INPUT.size * j) for j in range(nin)]
        pos += INPUT.size * nin
        if opcode >= len(OPCODES):
            raise ModelFormatError(f"{cmd}: opcode {opcode} is unknown (0..{len(OPCODES) - 1})")
        cmd += f" ({OPCODES[opcode]})"
        for role, t in [("output", out)] + [(f"input {j}", t) for j, (t, _) in enumerate(pairs)]:
            if t >= len(tensors):
                raise ModelFormatError(f"{cmd}: {role} tensor {t}; the program has {len(tensors)} tensors")
        if poff + plen > nparams:
            raise ModelFormatError(f"{cmd}: parameter block at {poff}, {plen} bytes, runs past the {nparams}-byte "
                                   f"PARAMS section")
        if woff + wlen > nweights:
            raise ModelFormatError(f"{cmd}: weight block at {woff}, {wlen} bytes, runs past the {nweights}-byte "
                                   f"WEIGHTS section")
        commands.append(CommandRecord(OPCODES[opcode], op, row0, rows, (poff, plen), (woff, wlen, codec, wcount),
                                      (out, out_off), pairs))
    return commands


def _meta(blob: bytes, where: str) -> dict:
    """META as a dict; its fields are checked with the rest (npuforge/compiler/validate.py)."""
    try:
        meta = json.loads(blob.decode()) if blob else {}
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        reason = "nested too deep" if isinstance(e, RecursionError) else str(e).split("\n")[0][:120]
        raise ModelFormatError(f"{where}: META: not JSON ({reason})") from None
    if not isinstance(meta, dict):
        raise ModelFormatError(f"{where}: META: a JSON {type(meta).__name__}, not an object")
    return meta
