"""Checks that a ``.tflite`` flatbuffer is whole before the TFLite importer reads it.

The ``tflite`` package's generated accessors follow the file's offsets without checking
them: on a corrupt or truncated file they raise struct / numpy errors, read bytes counted
from the end of the buffer (Python's negative offsets), or hand numpy a vector length
of billions. :func:`verify_model` walks every table, vector and string the importer
reads -- the model's operator codes and buffers, subgraph 0's tensors (their shape, name,
quantization) and operators -- and checks that each lies inside the buffer and that
every index one table holds into another (tensor, buffer, opcode) is in range, and that
tensor shapes are sane. :func:`verify_options` does the same for an operator's options
table when the importer reads it. Past them, the accessors the importer calls read
inside the file only.

:func:`read_sparsity` reads a sparse tensor's parameters (traversal order, block map,
dimension metadata) the same checked way, for the importer to densify it.

This is not a general flatbuffer verifier: fields the importer never reads are not
visited, so a file may pass here and still be refused by LiteRT.
"""

from __future__ import annotations

import struct

from flatbuffers.table import Table

from ..errors import ModelFormatError

# A tensor must have fewer elements than this (the IR's own limit): a shape read from a mutated
# file can then never make numpy allocate more than a few GB.
MAX_ELEMENTS = 2**31

# The scalar fields the importer reads: {vtable slot: width in bytes}, per table. (Offset
# fields -- tables, vectors, strings -- are checked where they are followed.)
_MODEL, _SUBGRAPH, _BUFFER = {}, {}, {6: 8, 8: 8}  # buffer: offset, size (models over 2 GB)
_TENSOR = {6: 1, 8: 4}  # type, buffer index
_QUANT = {16: 4}  # quantized_dimension
_OPERATOR = {4: 4}  # opcode_index
_OPCODE = {4: 1, 10: 4}  # deprecated_builtin_code, builtin_code
_OPTIONS = {  # per options table: the fields tflite_ops reads
    "PackOptions": {4: 4, 6: 4},
    "GatherOptions": {4: 4, 6: 4},
    "GeluOptions": {4: 1}, "LeakyReluOptions": {4: 4},
    "TransposeConvOptions": {4: 1, 6: 4, 8: 4, 10: 1},
    "BatchMatMulOptions": {4: 1, 6: 1, 8: 1},
    "Conv2DOptions": {4: 1, 6: 4, 8: 4, 10: 1, 12: 4, 14: 4},
    "DepthwiseConv2DOptions": {4: 1, 6: 4, 8: 4, 12: 1, 14: 4, 16: 4},
    "FullyConnectedOptions": {4: 1, 6: 1},
    "AddOptions": {4: 1}, "SubOptions": {4: 1}, "MulOptions": {4: 1},
    "UnidirectionalSequenceLSTMOptions": {4: 1, 6: 4, 8: 4, 10: 1, 12: 1, 14: 1},
    "Pool2DOptions": {4: 1, 6: 4, 8: 4, 10: 4, 12: 4, 14: 1},
    "ConcatenationOptions": {4: 4, 6: 1}, "ReducerOptions": {4: 1}, "SoftmaxOptions": {4: 4},
    "ResizeBilinearOptions": {8: 1, 10: 1}, "ResizeNearestNeighborOptions": {4: 1, 6: 1},
    "StridedSliceOptions": {4: 4, 6: 4, 8: 4, 10: 4, 12: 4, 14: 1},
    "DepthToSpaceOptions": {4: 4}, "SpaceToDepthOptions": {4: 4},
}
_DIM_METADATA = {4: 1, 6: 4, 8: 1, 12: 1}  # format, dense_size, the two index vectors' union types
_INDEX_VECTORS = {1: "<i4", 2: "<u2", 3: "u1"}  # SparseIndexVector: Int32Vector, Uint16Vector, Uint8Vector


class _Walker:
    """Bounds-checked reads of a flatbuffer; each failure names what was being read."""

    def __init__(self, buf: bytes, where: str):
        self.buf, self.where = buf, where

    def fail(self, what: str):
        raise ModelFormatError(f"{self.where}: corrupt or truncated TFLite file: {what}")

    def span(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or size < 0 or pos + size > len(self.buf):
            self.fail(f"{what} (bytes {pos}..{pos + size}) lies outside the {len(self.buf)}-byte file")

    def read(self, fmt: str, pos: int, what: str) -> int:
        self.span(pos, struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def table(self, pos: int, what: str, scalars: dict) -> Table:
        """The table at ``pos``: its vtable and its inline fields inside the file, and the
        ``scalars`` ({slot: width}) inside the table."""
        vtable = pos - self.read("<i", pos, what)
        vsize, osize = self.read("<H", vtable, f"{what}'s vtable"), self.read("<H", vtable + 2, f"{what}'s vtable")
        if vsize < 4 or vsize % 2 or osize < 4:
            self.fail(f"{what} has a malformed vtable (sizes {vsize}, {osize})")
        self.span(vtable, vsize, f"{what}'s vtable")
        self.span(pos, osize, what)
        tab = Table(self.buf, pos)
        for slot, width in scalars.items():
            off = tab.Offset(slot)
            if off and off + width > osize:
                self.fail(f"{what} has field {slot} outside its {osize} bytes")
        return tab

    def scalar(self, tab: Table, slot: int, fmt: str) -> int:
        """A scalar field of a table that ``table`` checked (0 when absent: the schema default)."""
        off = tab.Offset(slot)
        return struct.unpack_from(fmt, self.buf, tab.Pos + off)[0] if off else 0

    def target(self, tab: Table, slot: int, what: str) -> int | None:
        """Where an offset field (table, vector, string) points; None when it is absent."""
        off = tab.Offset(slot)
        if not off:
            return None
        at = tab.Pos + off
        return at + self.read("<I", at, what)

    def vector(self, tab: Table, slot: int, width: int, what: str) -> tuple[int, int]:
        """(start, length) of a vector field of ``width``-byte elements; (0, 0) when absent."""
        at = self.target(tab, slot, what)
        if at is None:
            return 0, 0
        n = self.read("<I", at, f"the length of {what}")
        self.span(at + 4, n * width, f"{what} ({n} elements)")
        return at + 4, n

    def tables(self, tab: Table, slot: int, what: str, scalars: dict) -> list[Table]:
        start, n = self.vector(tab, slot, 4, f"the {what} list")
        return [self.table(start + 4 * k + self.read("<I", start + 4 * k, f"{what} {k}"), f"{what} {k}", scalars)
                for k in range(n)]

    def ints(self, tab: Table, slot: int, what: str) -> list[int]:
        """An int32 vector field's values."""
        start, n = self.vector(tab, slot, 4, what)
        return list(struct.unpack_from(f"<{n}i", self.buf, start)) if n else []

    def string(self, tab: Table, slot: int, what: str) -> None:
        at = self.target(tab, slot, what)
        if at is not None:
            self.span(at + 4, self.read("<I", at, f"the length of {what}"), what)


def verify_model(buf: bytes, where: str) -> None:
    """Raise ModelFormatError naming the first part of the file the importer would read
    outside the buffer, or an index / shape no valid model has."""
    w = _Walker(buf, where)
    model = w.table(w.read("<I", 0, "the root offset"), "the model table", _MODEL)
    codes = w.tables(model, 6, "operator code", _OPCODE)
    for k, code in enumerate(codes):
        w.string(code, 6, f"operator code {k}'s custom name")
    buffers = w.tables(model, 12, "buffer", _BUFFER)
    for k, b in enumerate(buffers):
        w.vector(b, 4, 1, f"buffer {k}'s data")
        offset, size = w.scalar(b, 6, "<Q"), w.scalar(b, 8, "<Q")
        if offset > 1 and offset + size > len(buf):  # data kept after the flatbuffer
            w.fail(f"buffer {k}'s {size} bytes at byte {offset} lie outside the {len(buf)}-byte file")
    subgraphs = w.tables(model, 8, "subgraph", _SUBGRAPH)
    if not subgraphs:
        w.fail("the model has no subgraph")
    sg = subgraphs[0]  # the importer reads the main subgraph only
    tensors = w.tables(sg, 4, "tensor", _TENSOR)
    for k, t in enumerate(tensors):
        _verify_tensor(w, t, k, len(buffers))
    n = len(tensors)
    for what, slot in (("graph input", 6), ("graph output", 8)):
        for i in w.ints(sg, slot, f"the {what}s"):
            if not 0 <= i < n:
                w.fail(f"a {what} is tensor {i}, but the subgraph has {n} tensors")
    for k, op in enumerate(w.tables(sg, 10, "operator", _OPERATOR)):
        code = w.scalar(op, 4, "<I")
        if code >= len(codes):
            w.fail(f"operator {k} has opcode index {code}, but the model has {len(codes)} operator codes")
        for what, slot, low in (("input", 6, -1), ("output", 8, 0), ("intermediate", 20, 0)):  # -1: omitted
            for i in w.ints(op, slot, f"operator {k}'s {what}s"):
                if not low <= i < n:
                    w.fail(f"operator {k} has {what} tensor {i}, but the subgraph has {n} tensors")
        w.target(op, 12, f"operator {k}'s options")  # the table itself: verify_options, when read


def _verify_tensor(w: _Walker, t: Table, k: int, buffers: int) -> None:
    what = f"tensor {k}"
    start, rank = w.vector(t, 4, 4, f"{what}'s shape")
    dims = struct.unpack_from(f"<{rank}i", w.buf, start) if rank else ()
    if any(d < 0 for d in dims):
        w.fail(f"{what} has the shape {_shape(dims)}, with a negative dimension")
    count = 0 if 0 in dims else 1
    for d in dims:
        count *= d
        if count >= MAX_ELEMENTS:  # (stop early: a mutated rank can be in the hundred thousands)
            w.fail(f"{what} has the shape {_shape(dims)}: 2^31 elements or more, past what npuforge supports")
    index = w.scalar(t, 8, "<I")
    if index >= buffers:
        w.fail(f"{what} has buffer index {index}, but the model has {buffers} buffers")
    w.string(t, 10, f"{what}'s name")
    w.vector(t, 18, 4, f"{what}'s shape signature")  # (read to tell a dynamic dimension)
    if t.Offset(16):
        w.read("<I", t.Pos + t.Offset(16), f"{what}'s sparsity")  # only its presence is read
    at = w.target(t, 12, f"{what}'s quantization")
    if at is None:
        return
    q = w.table(at, f"{what}'s quantization", _QUANT)
    _, scales = w.vector(q, 8, 4, f"{what}'s scales")
    _, zero_points = w.vector(q, 10, 8, f"{what}'s zero points")
    if zero_points not in (0, scales):
        w.fail(f"{what} has {scales} scales but {zero_points} zero points")
    if scales > 1:  # per channel: one scale per index of the quantized dimension
        axis = w.scalar(q, 16, "<i")
        if not 0 <= axis < rank or dims[axis] != scales:
            w.fail(f"{what} (shape {_shape(dims)}) has {scales} scales along dimension {axis}")


def _shape(dims) -> str:
    """A shape for a one-line message: a mutated rank can be in the thousands."""
    return str(list(dims)) if len(dims) <= 8 else f"[{', '.join(map(str, dims[:8]))}, ...] (rank {len(dims)})"


def verify_options(table: Table, cls: str, where: str, at: str) -> None:
    """An operator's options table (read as ``cls``) lies inside the file, with its fields."""
    w = _Walker(table.Bytes, where)
    w.table(table.Pos, f"the options of {at}", _OPTIONS[cls])  # (a new rule's options need an entry)


def read_sparsity(buf: bytes, tensor_pos: int, where: str, what: str) -> tuple[list, list, list]:
    """A sparse tensor's parameters, every offset and length checked: (traversal order, block
    map, one (format, dense_size, array_segments, array_indices) per level of the traversal,
    the two arrays int64 numpy vectors, or None where absent)."""
    import numpy as np

    w = _Walker(buf, where)
    tensor = w.table(tensor_pos, what, {})
    at = w.target(tensor, 16, f"{what}'s sparsity")
    if at is None:
        w.fail(f"{what} has no sparsity parameters")
    sp = w.table(at, f"{what}'s sparsity", {})
    order = w.ints(sp, 4, f"{what}'s traversal order")
    block_map = w.ints(sp, 6, f"{what}'s block map")
    levels = []
    for k, d in enumerate(w.tables(sp, 8, f"{what}'s dimension metadata", _DIM_METADATA)):
        arrays = []
        for type_slot, slot, name in ((8, 10, "array_segments"), (12, 14, "array_indices")):
            kind, pos = w.scalar(d, type_slot, "<B"), w.target(d, slot, f"{what}'s level {k} {name}")
            if kind == 0 or pos is None:
                arrays.append(None)
                continue
            if kind not in _INDEX_VECTORS:
                w.fail(f"{what}'s level {k} {name} has the index vector type {kind} (1 to 3 are defined)")
            dtype = np.dtype(_INDEX_VECTORS[kind])
            start, n = w.vector(w.table(pos, f"{what}'s level {k} {name}", {}), 4, dtype.itemsize,
                                f"{what}'s level {k} {name}")
            arrays.append(np.frombuffer(buf, dtype, n, start).astype(np.int64) if n else np.zeros(0, np.int64))
        levels.append((w.scalar(d, 4, "<b"), w.scalar(d, 6, "<i"), arrays[0], arrays[1]))
    return order, block_map, levels
