"""The program simulator: runs an ``.npub`` binary and nothing else.

SRAM is one byte array the size of the program's arena, DRAM another for the tensors the
compiler spilled (the weight and parameter sections stand for the rest of DRAM). Each command reads its input rows from SRAM at the offsets it
names (a rolling buffer holds row r in slot r mod its rows), computes its stripe with the
NPU kernels (npuforge/compiler/kernels.py) from its parameter block and decoded weights,
and writes its output rows back. The simulator tracks which row every slot of every buffer
holds, so a schedule that reads a row its buffer no longer holds (or never held), or a
plan that lets two live buffers overlap, fails loudly instead of computing garbage. The reader
(npuforge/compiler/binfmt.py, validate.py) has checked every field this relies on, so a
malformed program never reaches a kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ModelFormatError, NpuforgeError, ShapeError
from . import kernels
from .binfmt import MEMORIES, NODE_OPCODES, QRANGE, ProgramImage, read_program
from .weights import decode

NP_DTYPES = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "float32": np.float32, "int32": np.int32,
             "int64": np.int64}


def load_program(path) -> ProgramImage:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise NpuforgeError(f"{path}: cannot read ({e.strerror})") from None
    return read_program(data, str(path))


class ProgramSimulator:
    """``ProgramSimulator(image).run({input name: array})`` -> {output name: int codes (NCHW)}."""

    def __init__(self, image: ProgramImage):
        self.img = image  # read_program checked it: arena, parameter blocks, weight blocks, shapes
        self.arena = image.arena
        self._weights: dict = {}
        self._kernels: dict = {}  # a node command's node -> its kernel (cpu.py)

    # -- constants ------------------------------------------------------------------------------
    def params(self, c) -> dict:
        return self.img.blocks[c.params]  # decoded and checked by the reader

    def weights(self, c, p: dict) -> np.ndarray | None:
        off, length, codec, count = c.weights
        if length == 0:
            return None
        out = self.img.tensors[c.output[0]]
        src = self.img.tensors[c.inputs[0][0]]
        if c.kind == "conv":
            shape = (out.c, p["kernel_h"], p["kernel_w"], src.c // p["group"])
        elif c.kind == "depthwise":
            shape = (p["kernel_h"], p["kernel_w"], out.c)
        else:
            shape = (out.c, src.c)
        key = (c.weights, shape)  # commands sharing a block may (in a crafted file) read it as other shapes
        if key not in self._weights:
            w = decode(codec, self.img.weights[off:off + length], count)
            if w.size != int(np.prod(shape)):
                raise ModelFormatError(f"a {c.kind} weight block holds {w.size} weights, its shape needs "
                                       f"{int(np.prod(shape))}")
            self._weights[key] = w.reshape(shape).astype(np.int64)
        return self._weights[key]

    # -- memory ---------------------------------------------------------------------------------
    def _view(self, mem, t: int, off: int) -> np.ndarray:
        rec = self.img.tensors[t]
        raw = mem[rec.memory][off: off + rec.ring_rows * rec.row_bytes]
        return raw.view(NP_DTYPES[rec.dtype]).reshape(rec.ring_rows, rec.w, rec.c)

    def _read(self, mem, tags, k: int, t: int, off: int, lo: int, hi: int, fill: int) -> np.ndarray:
        rec = self.img.tensors[t]
        buf = self._view(mem, t, off)
        out = np.full((hi - lo, rec.w, rec.c), fill, np.float32 if rec.dtype == "float32" else np.int64)
        rows = np.arange(max(lo, 0), min(hi, rec.h))
        if not rows.size:  # the stripe reads padding only
            return out
        held = tags.get((rec.memory, off))
        slots = rows % rec.ring_rows
        if held is None or held[1] != t or (held[0][slots] != rows).any():
            bad = rows[0] if held is None or held[1] != t else rows[held[0][slots] != rows][0]
            raise NpuforgeError(f"program fault: command {k} reads row {bad} of '{rec.name}', which its "
                                f"buffer at {MEMORIES[rec.memory]} offset {off} does not hold")
        out[rows - lo] = buf[slots]
        return out

    def _write(self, mem, tags, t: int, off: int, row0: int, data: np.ndarray) -> None:
        rec = self.img.tensors[t]
        buf = self._view(mem, t, off)
        end = off + rec.ring_rows * rec.row_bytes
        key = (rec.memory, off)
        # a write ends what any other buffer held in these bytes
        for other in [k for k in tags if k[0] == rec.memory and k != key and k[1] < end and k[1] + tags[k][2] > off]:
            del tags[other]
        if key not in tags or tags[key][1] != t:
            tags[key] = (np.full(rec.ring_rows, -1, np.int64), t, rec.ring_rows * rec.row_bytes)
        rows = np.arange(row0, row0 + len(data))
        if len(data) > rec.ring_rows:
            raise NpuforgeError(f"program fault: {len(data)} rows written to a {rec.ring_rows}-row buffer of "
                                f"'{rec.name}'")
        if rec.dtype in QRANGE:  # codes saturate; a float or an index is stored as it is
            data = np.clip(data, *QRANGE[rec.dtype])
        buf[rows % rec.ring_rows] = data.astype(NP_DTYPES[rec.dtype])
        tags[key][0][rows % rec.ring_rows] = rows

    # -- run ------------------------------------------------------------------------------------
    def run(self, feeds: dict) -> dict:
        img = self.img
        mem = {0: np.zeros(self.arena, np.uint8), 1: np.zeros(img.dram_arena, np.uint8)}  # by tensor memory
        tags: dict = {}  # (memory, buffer offset) -> (row held per slot, tensor, bytes)
        for t, shape in img.inputs:
            rec = img.tensors[t]
            if rec.name not in feeds:
                raise NpuforgeError(f"missing input '{rec.name}' (the program's inputs: "
                                    f"{', '.join(img.tensors[i].name for i, _ in img.inputs)})")
            x = np.asarray(feeds[rec.name])
            if x.dtype.kind not in "biuf":
                raise ShapeError(f"input '{rec.name}': a {x.dtype} array; the program takes numbers")
            if x.shape != shape:
                raise ShapeError(f"input '{rec.name}': shape {list(x.shape)}, the program takes {list(shape)}")
            if x.dtype != NP_DTYPES[rec.dtype] and rec.dtype in QRANGE:  # float: quantized with the input's parameters
                lo, hi = QRANGE[rec.dtype]
                x = np.clip(np.rint(x.astype(np.float32) / np.float32(rec.scale)) + rec.zero_point, lo, hi)
            # 4-D: NCHW to channel-last; any other rank is stored in its own element order
            hwc = x.reshape(rec.c, rec.h, rec.w).transpose(1, 2, 0) if len(shape) == 4 else \
                x.reshape(rec.h, rec.w, rec.c)
            self._write(mem, tags, t, rec.offset, 0, hwc.astype(NP_DTYPES[rec.dtype] if rec.dtype not in QRANGE
                                                                    else np.int64))
        for k, c in enumerate(img.commands):
            self._command(mem, tags, k, c)
        result = {}
        for t, shape in img.outputs:
            rec = img.tensors[t]
            hwc = self._read(mem, tags, len(img.commands), t, rec.offset, 0, rec.h, 0)
            arr = hwc.transpose(2, 0, 1) if len(shape) == 4 else hwc
            result[rec.name] = arr.reshape(shape).astype(NP_DTYPES[rec.dtype])
        return result

    def _node_command(self, mem, tags, k: int, c, p: dict) -> None:
        """A node command: its node run on whole tensors by the integer simulator's kernel (cpu.py)."""
        key = p["node"]
        if key not in self._kernels:
            from .cpu import CpuKernel

            self._kernels[key] = CpuKernel(self.img.nodes[key])
        ins = [self._read(mem, tags, k, t, off, 0, self.img.tensors[t].h, 0) for t, off in c.inputs]
        ins = [x.astype(NP_DTYPES[self.img.tensors[t].dtype]) for x, (t, _) in zip(ins, c.inputs)]
        y = self._kernels[key].run_stored(ins, p["output_index"])
        self._write(mem, tags, c.output[0], c.output[1], 0, y)

    def _command(self, mem, tags, k: int, c) -> None:
        p = self.params(c)
        if c.kind in NODE_OPCODES:
            return self._node_command(mem, tags, k, c, p)
        w = self.weights(c, p)
        out_t, out_off = c.output
        out = self.img.tensors[out_t]
        a, b = c.row0, c.row0 + c.rows
        ins = []
        for j, (t, off) in enumerate(c.inputs):
            src = self.img.tensors[t]
            lo, hi = kernels.needed_rows(c.kind, p, a, b, src.h, j)
            fill = kernels.PAD_MAX if c.kind == "maxpool" else p.get("zp_in", 0)
            ins.append((self._read(mem, tags, k, t, off, lo, hi, fill), lo))
        x, lo = ins[0]
        kind = c.kind
        if kind == "conv":
            y = kernels.conv(x, p, w, c.rows, out.w)
        elif kind == "depthwise":
            y = kernels.depthwise(x, p, w, c.rows, out.w)
        elif kind == "fully_connected":
            y = kernels.fully_connected(x, p, w)
        elif kind in ("add", "sub", "mul"):
            y = kernels.elementwise(kind, x, ins[1][0], p)
        elif kind == "avgpool":
            y = kernels.avgpool(x, p, c.rows, out.w, a)
        elif kind == "global_avgpool":
            y = kernels.global_avgpool(x, p)
        elif kind == "maxpool":
            y = kernels.maxpool(x, p, c.rows, out.w)
        elif kind == "lut":
            y = kernels.lut(x, p)
        elif kind == "concat":
            y = np.concatenate([arr for arr, _ in ins], axis=2)
        elif kind == "resize_bilinear":
            y = kernels.resize_bilinear(x, p, lo, a, b)
        else:  # pragma: no cover - the reader refuses unknown opcodes
            raise ModelFormatError(f"command {k}: unknown operation {kind}")
        if y.shape != (c.rows, out.w, out.c):
            y = np.broadcast_to(y, (c.rows, out.w, out.c))
        self._write(mem, tags, out_t, out_off, a, y)


def run_program(path_or_image, feeds: dict) -> dict:
    image = load_program(path_or_image) if not isinstance(path_or_image, ProgramImage) else path_or_image
    return ProgramSimulator(image).run(feeds)
