"""Fuzzing the ``.npub`` reader (tests/fuzz_harness.py says what a clean end is).

A small program with every NPU operation (a 3-input concat, rolling buffers, int8 weights, two
outputs, a preprocessing record) is compiled once; then ``npuforge run`` must end cleanly on
(a) seeded byte mutations of it, which mostly fail their checksums, and (b) structure-aware
mutations that set one field of the header, the section table, a tensor, command, IO record or
parameter entry to an extreme, swap dimensions, drop, repeat or truncate a section, change a
command's input count, or replace META or STRINGS, and then re-compute every checksum, so that
each reaches the reader's field checks. ``inspect`` and ``check`` say the file is a program.
"""

from __future__ import annotations

import json
import math
import random
import struct
import zlib

import numpy as np
import pytest
from compiler_graphs import Builder
from fuzz_harness import fuzz_cases, mutations, run_case
from PIL import Image

import npuforge
from npuforge.compiler import binfmt
from npuforge.compiler.binfmt import COMMAND, HEADER, INPUT, IO, PARAM_ENTRY, SECTION, SECTIONS, TENSOR
from npuforge.compiler.compile import compile_graph
from npuforge.compiler.target import load_target
from npuforge.frontend.onnx_importer import import_onnx

pytestmark = pytest.mark.slow  # seconds of mutated inputs; their verdicts do not depend on float kernels

PREPROCESS = {"resize_size": 18, "crop_size": [16, 16], "interpolation": "bilinear", "mean": [123.675, 116.28, 103.53],
              "std": [58.395, 57.12, 57.375], "source": "test"}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    rng = np.random.default_rng(11)
    b = Builder(rng, 3, 16, 16)
    x, s = b.conv("input", (3, 16, 16), 8, 3, 2, 1, 1, [1, 1, 1, 1], "relu")
    y, _ = b.conv(x, s, 8, 3, 1, 1, 8, [1, 1, 1, 1], "relu6")  # depthwise
    x = b.node("Add", [x, y])
    y1, _ = b.conv(x, s, 4, 1, 1, 1, 1, [0, 0, 0, 0], "relu")
    y2, _ = b.conv(x, s, 3, 3, 1, 1, 1, [1, 1, 1, 1], "leaky")
    x = b.node("Concat", [x, y1, y2], axis=1)
    x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 0, 0])
    x = b.node("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)
    g, _ = b.conv(x, (15, 4, 4), 15, 1, 1, 1, 1, [0, 0, 0, 0], "")
    x = b.node("Mul", [x, b.node("Sigmoid", [g])])
    up = b.node("Resize", [x, "", "", b.const(np.array([1, 15, 8, 8], np.int64))], mode="linear",
                coordinate_transformation_mode="half_pixel")
    pooled = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    wt = rng.normal(0, 0.3, (5, 15)).astype(np.float32)
    logits = b.node("Gemm", [pooled, b.const(wt), b.const(np.zeros(5, np.float32))], transB=1)
    probs = b.node("Softmax", [b.node("Transpose", [x], perm=[0, 1, 3, 2])], axis=3)  # node commands (host CPU)
    graph = import_onnx(b.model([up, logits, probs], "fuzz"))
    graph = npuforge.quantize(graph, [rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(3)], {})
    graph.metadata["preprocess"] = PREPROCESS
    target = load_target("npu256")
    whole = compile_graph(graph, target, sram=1 << 30, tolerance=0.0)
    program = compile_graph(graph, target, sram=whole.peak - 1, tolerance=10.0)  # cascades: rolling buffers
    kinds = {op.kind for op in program.lowered.ops}
    assert kinds >= {"conv", "depthwise", "fully_connected", "add", "mul", "avgpool", "global_avgpool", "maxpool",
                     "lut", "concat", "resize_bilinear", "cpu"}, kinds
    assert program.stats["cascades"]
    folder = tmp_path_factory.mktemp("fuzznpub")
    (folder / "good.npub").write_bytes(program.data)
    np.save(folder / "x.npy", rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32))
    Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(folder / "photo.png")
    assert run_case(["run", folder / "good.npub", "--input", folder / "x.npy"])[0] == 0
    assert run_case(["run", folder / "good.npub", "--input", folder / "photo.png"])[0] == 0
    return folder, program.data


def _run(folder, data: bytes, rng: random.Random) -> tuple[int, str]:
    path = folder / "case.npub"
    path.write_bytes(data)
    argv = ["run", path, "--input", folder / ("photo.png" if rng.random() < 0.25 else "x.npy")]
    if rng.random() < 0.2:
        argv += ["--codes", "--output", folder / "out.npz", "--force"]
    return run_case(argv, protect=[folder / "good.npub", folder / "x.npy", folder / "photo.png"])


def test_byte_mutations_of_a_program_end_cleanly(work):
    folder, data = work
    rng = random.Random(2024)
    codes = [_run(folder, bad, rng)[0] for bad in mutations(data, rng, fuzz_cases(120))]
    assert codes.count(2) > len(codes) // 2  # checksums refuse most


# -- structure-aware mutations -------------------------------------------------------------------------
def _fields(fmt: str) -> list[tuple[int, str]]:
    """(offset, type char) of every field of a struct format (pad bytes skipped)."""
    out, pos = [], 0
    for ch in fmt.lstrip("<"):
        if ch != "x":
            out.append((pos, ch))
        pos += struct.calcsize("<" + ch)
    return out


RANGES = {"B": (0, 0xFF), "H": (0, 0xFFFF), "I": (0, 2**32 - 1), "i": (-(2**31), 2**31 - 1)}
EXTREMES = {"B": [0, 1, 0x7F, 0xFF], "H": [0, 1, 0x8000, 0xFFFF], "I": [0, 1, 0x10000, 2**31 - 1, 2**31, 2**32 - 1],
            "i": [0, -1, 2**31 - 1, -(2**31)], "f": [0.0, -1.0, math.nan, math.inf, 1e-45, 3e38]}


def _value(ch: str, current, rng: random.Random):
    if ch != "f" and rng.random() < 0.3:  # next to the valid value: off-by-one checks
        lo, hi = RANGES[ch]
        return min(hi, max(lo, current + rng.choice([-1, 1, 2])))
    return rng.choice(EXTREMES[ch])


def split(data: bytes) -> list[list]:
    """[[kind, bytearray]] of the sections, in table order."""
    nsec = struct.unpack_from("<I", data, 8)[0]
    out = []
    for k in range(nsec):
        kind, off, size, _ = SECTION.unpack_from(data, HEADER.size + SECTION.size * k)
        out.append([kind, bytearray(data[off:off + size])])
    return out


def assemble(secs: list[list]) -> bytearray:
    """A file of these sections, laid out and checksummed as write_program does."""
    return bytearray(binfmt.assemble(secs))


def rechecksum(b: bytearray, keep=()) -> bytes:
    """Every section's and the header's CRC (and the size) made right again, except the fields in keep."""
    nsec = min(struct.unpack_from("<I", b, 8)[0], (len(b) - HEADER.size) // SECTION.size)
    for k in range(nsec):
        at = HEADER.size + SECTION.size * k
        _, off, size, _ = SECTION.unpack_from(b, at)
        if ("table", k, 12) not in keep and off + size <= len(b):
            struct.pack_into("<I", b, at + 12, zlib.crc32(b[off:off + size]))
    if ("header", 12) not in keep:
        struct.pack_into("<I", b, 12, len(b))
    if ("header", 16) not in keep:
        struct.pack_into("<I", b, 16, zlib.crc32(b[HEADER.size:]))
    return bytes(b)


def record_fields(secs: list[list]) -> list[tuple[int, int, str]]:
    """(section index, byte offset in it, type char) of every record field of every section."""
    idx = {kind: k for k, (kind, _) in enumerate(secs)}
    out = []
    for name, rec in (("TENSORS", TENSOR), ("IO", IO)):
        k = idx[SECTIONS.index(name)]
        for r in range(len(secs[k][1]) // rec.size):
            out += [(k, r * rec.size + off, ch) for off, ch in _fields(rec.format)]
    k, blob, pos = idx[SECTIONS.index("COMMANDS")], secs[idx[SECTIONS.index("COMMANDS")]][1], 0
    while pos + COMMAND.size <= len(blob):
        out += [(k, pos + off, ch) for off, ch in _fields(COMMAND.format)]
        nin = min(blob[pos + 1], (len(blob) - pos - COMMAND.size) // INPUT.size)  # a mutated count may overrun
        for j in range(nin):
            out += [(k, pos + COMMAND.size + INPUT.size * j + off, ch) for off, ch in _fields(INPUT.format)]
        pos += COMMAND.size + INPUT.size * nin
    k, blob, pos = idx[SECTIONS.index("PARAMS")], secs[idx[SECTIONS.index("PARAMS")]][1], 0
    while pos + PARAM_ENTRY.size <= len(blob):  # blocks are contiguous entries, 4-byte aligned
        out += [(k, pos + off, ch) for off, ch in _fields(PARAM_ENTRY.format)]
        count = min(struct.unpack_from("<I", blob, pos + 4)[0], (len(blob) - pos - PARAM_ENTRY.size) // 4)
        out += [(k, pos + PARAM_ENTRY.size + 4 * j, "i") for j in range(count)]
        pos += PARAM_ENTRY.size + 4 * count
    return out


def commands(blob: bytes) -> list[tuple[int, int]]:
    """(offset, input count) of every command record."""
    out, pos = [], 0
    while pos + COMMAND.size <= len(blob):
        out.append((pos, blob[pos + 1]))
        pos += COMMAND.size + INPUT.size * blob[pos + 1]
    return out


BAD_META = [b"[]", b'"x"', b"{}", b"5", b"null", b"{", b"\xff\xfe", b"[" * 100000, b'{"preprocess": 5}',
            b'{"preprocess": {}}', b'{"preprocess": []}']
BAD_PREPROCESS = [("crop_size", [0, 0]), ("crop_size", [16]), ("crop_size", [2**31, 2**31]), ("crop_size", [8, 8]),
                  ("crop_size", "x"), ("resize_size", 10**9), ("resize_size", 0), ("resize_size", None),
                  ("interpolation", "cubic"), ("interpolation", 3), ("mean", "a"), ("mean", [1, 2]),
                  ("std", [0, 0, 0]), ("std", [1, "x", 1]), ("fit", "crop"), ("fit", "letterbox"), ("fit", "resize")]


def structured(data: bytes, rng: random.Random) -> bytes:
    """One structure-aware mutation of ``data``, its checksums made right (unless it set one)."""
    secs = split(data)
    idx = {kind: k for k, (kind, _) in enumerate(secs)}
    kind = rng.choices(["record", "header", "table", "sections", "inputs", "swap", "meta", "strings", "weights",
                        "truncate"], [40, 4, 6, 5, 5, 6, 6, 2, 4, 3])[0]
    keep = ()
    if kind == "record":
        for _ in range(rng.choice([1, 1, 1, 2])):
            k, off, ch = rng.choice(record_fields(secs))
            blob = secs[k][1]
            struct.pack_into("<" + ch, blob, off, _value(ch, struct.unpack_from("<" + ch, blob, off)[0], rng))
    elif kind == "sections":
        k = rng.randrange(len(secs))
        op = rng.choice(["drop", "repeat", "rekind", "empty", "unknown"])
        if op == "drop":
            del secs[k]
        elif op == "repeat":
            secs.append([secs[k][0], bytearray(secs[k][1])])
        elif op == "rekind":
            secs[k][0] = rng.randrange(len(SECTIONS))
        elif op == "empty":
            secs[k][1] = bytearray()
        else:
            secs.append([rng.choice([7, 99, 2**32 - 1]), bytearray(b"future")])  # a later minor version's
    elif kind == "inputs":  # a command gains or loses an input (the records stay consistent)
        k = idx[SECTIONS.index("COMMANDS")]
        pos, nin = rng.choice(commands(secs[k][1]))
        blob = secs[k][1]
        if nin and rng.random() < 0.5:
            j = rng.randrange(nin)
            del blob[pos + COMMAND.size + INPUT.size * j: pos + COMMAND.size + INPUT.size * (j + 1)]
            blob[pos + 1] = nin - 1
        else:
            at = pos + COMMAND.size + INPUT.size * nin
            blob[at:at] = INPUT.pack(rng.randrange(4), 0)
            blob[pos + 1] = nin + 1
    elif kind == "swap":  # two fields of one record exchanged: flipped dims, swapped tensors or rows
        name = rng.choice(["TENSORS", "IO", "COMMANDS"])
        rec = {"TENSORS": TENSOR, "IO": IO, "COMMANDS": COMMAND}[name]
        blob = secs[idx[SECTIONS.index(name)]][1]
        starts = [p for p, _ in commands(blob)] if name == "COMMANDS" else range(0, len(blob), rec.size)
        base = rng.choice(list(starts))
        o1, o2 = rng.sample([off for off, ch in _fields(rec.format) if ch == "I"], 2)
        v1, v2 = (struct.unpack_from("<I", blob, base + o)[0] for o in (o1, o2))
        struct.pack_into("<I", blob, base + o1, v2)
        struct.pack_into("<I", blob, base + o2, v1)
    elif kind == "meta":
        k = idx[SECTIONS.index("META")]
        if rng.random() < 0.4:
            secs[k][1] = bytearray(rng.choice(BAD_META))
        else:
            meta = json.loads(secs[k][1])
            field, value = rng.choice(BAD_PREPROCESS)
            meta["preprocess"] = {**PREPROCESS, field: value}
            secs[k][1] = bytearray(json.dumps(meta).encode())
    elif kind == "strings":
        k = idx[SECTIONS.index("STRINGS")]
        secs[k][1] = bytearray(rng.choice([b"", b"\xff\xfe\xfd", b"a", bytes(secs[k][1]).replace(b"\0", b"", 3)]))
    elif kind == "weights":
        k = idx[SECTIONS.index("WEIGHTS")]
        blob = secs[k][1]
        off = rng.randrange(len(blob))
        blob[off:off + 4] = rng.choice(EXTREMES["I"]).to_bytes(4, "little")[:len(blob[off:off + 4])]
    elif kind == "truncate":
        k = rng.randrange(len(secs))
        secs[k][1] = secs[k][1][:rng.randrange(len(secs[k][1]) + 1)]
    b = assemble(secs)
    if kind == "header":
        off, ch = rng.choice([(4, "H"), (6, "H"), (8, "I"), (12, "I"), (16, "I"), (20, "I")])
        struct.pack_into("<" + ch, b, off, _value(ch, struct.unpack_from("<" + ch, b, off)[0], rng))
        keep = {("header", off)}
    elif kind == "table":
        k = rng.randrange(len(secs))
        off = rng.choice([0, 4, 8, 12])
        at = HEADER.size + SECTION.size * k + off
        struct.pack_into("<I", b, at, _value("I", struct.unpack_from("<I", b, at)[0], rng))
        keep = {("table", k, off)}
    return rechecksum(b, keep)


def test_structure_aware_mutations_with_valid_checksums_end_cleanly(work):
    folder, data = work
    rng = random.Random(7)
    errors = []
    for _ in range(fuzz_cases(300)):
        code, err = _run(folder, structured(data, rng), rng)
        if code == 2:
            errors.append(err)
    # the checksums are right: the field checks, not the CRCs, refuse these
    assert errors and sum("checksum" in e for e in errors) < len(errors) // 5


def test_field_checks_name_the_file_section_record_and_field(work):
    """A few hand-made cases from the issue: each refused in one line naming where."""
    folder, data = work
    secs = split(data)
    idx = {kind: k for k, (kind, _) in enumerate(secs)}

    def variant(name: str, change) -> bytes:
        s = [[k, bytearray(b)] for k, b in secs]
        change(s[idx[SECTIONS.index(name)]][1]) if name else change(s)
        return rechecksum(assemble(s))

    def set_field(rec, record: int, field: int, value):
        off, ch = _fields(rec.format)[field]
        return lambda blob: struct.pack_into("<" + ch, blob, record * rec.size + off, value)

    cmd0 = lambda field, value: lambda blob: struct.pack_into("<" + _fields(COMMAND.format)[field][1], blob,
                                                              _fields(COMMAND.format)[field][0], value)
    cases = {
        "no IO section": (variant("", lambda s: s.pop(idx[SECTIONS.index("IO")])), "no IO section"),
        "width 2^31": (variant("TENSORS", set_field(TENSOR, 0, 3, 2**31)), "TENSORS record 0"),
        "zero height": (variant("TENSORS", set_field(TENSOR, 1, 2, 0)), "height 0"),
        "flipped IO dims": (variant("IO", lambda b: b.__setitem__(slice(12, 20), b[16:20] + b[12:16])),
                            "IO input 0"),  # C and H
        "unknown opcode": (variant("COMMANDS", cmd0(0, 200)), "opcode 200 is unknown"),
        "codec 7": (variant("COMMANDS", cmd0(11, 7)), "codec 7"),
        "META []": (variant("META", lambda b: b.__setitem__(slice(None), b"[]")), "META: a JSON list"),
        "no parameters": (variant("COMMANDS", cmd0(7, 0)), "lacks"),
    }
    for name, (blob, expect) in cases.items():
        path = folder / "case.npub"
        path.write_bytes(blob)
        code, err = run_case(["run", path, "--input", folder / "x.npy"])
        assert code == 2 and expect in err and str(path) in err, (name, err)


def test_inspect_and_check_say_a_program_is_not_a_model(work):
    folder, data = work
    for command in ("inspect", "check"):
        for blob in (data, data[:100]):
            (folder / "p.npub").write_bytes(blob)
            code, err = run_case([command, folder / "p.npub"])
            assert code == 2 and "an NPU program" in err and "npuforge run" in err, err
