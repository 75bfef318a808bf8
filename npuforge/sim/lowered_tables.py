"""The float lowering's table-driven nodes (a mixin of :mod:`npuforge.sim.lowered`'s
builder): every output the plain simulator computes from one 8-bit code, a pair of
codes or an exact sum is read from a table the plain simulator itself filled, with
``Gather`` at an exact integer index. Add / Sub / Mul of two activations (all
256 x 256 results), of one with a constant or itself (256 per element of the
constant, or per distinct code of a large one), lookup ops, and the pools (one table per window count over every
possible sum).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from onnx import TensorProto

from ..ops.registry import get_op
from . import lowered_int64 as int64_rules
from ..quant.minmax_rule import operand_codes as minmax_operand
from .int_ops import NP_INT

MAX_TABLE = 1 << 22  # entries of a pooling table (sums of at most 16 K int8 values)


class TableLowerings:
    """``_elementwise``, ``_pool``, ``_lut``, ``_minmax``, ``_prelu``, ``_divide`` for a builder with ``emit``, ``const``,
    ``activation``, ``refuse``, ``plain``, ``graph`` and ``report``."""

    def _gather(self, node, index: str, table: np.ndarray, what: str):
        """out = table[int(index)]: ``index`` a float tensor of exact non-negative integers."""
        idx = self.emit("Cast", [index], f"{node.name}::idx", to=TensorProto.INT32)
        tab = self.const(f"{node.name}::table", table.astype(np.float32))
        self.lookup(tab, idx, node.outputs[0])
        self.report[node.name] = what

    def _elementwise(self, node):
        names = node.inputs[:2]
        consts = [k for k in range(2) if f"input{k}" in node.quant]
        if consts or len(set(names)) < 2:
            return self._elementwise_unary(node, 1 - consts[0] if consts else 0)
        qs = [self.activation(node, n) for n in names]
        yq = self.activation(node, node.outputs[0])
        if any(q.dtype not in ("int8", "uint8") for q in qs):  # no table of every pair
            self.report[node.name] = int64_rules.elementwise(self, node)
            return
        self._pair_table(node, qs, yq, self.plain._elementwise)

    def _pair_table(self, node, qs, yq, compute):
        """Two 8-bit activations: ``compute(node, env)``'s output codes on every pair of codes,
        read with ``Gather`` at ``n1 * a' + b'`` (offset to the table's start)."""
        names = node.inputs[:2]
        codes = [np.arange(q.qmin, q.qmax + 1).astype(NP_INT[q.dtype]) for q in qs]
        env = {names[0]: torch.from_numpy(codes[0])[:, None], names[1]: torch.from_numpy(codes[1])[None, :]}
        table = compute(node, env)[0].numpy().astype(np.int64) - int(yq.zero_point)
        n1 = len(codes[1])
        low = [q.qmin - int(q.zero_point) for q in qs]
        scaled = self.emit("Mul", [names[0], self.const(f"{node.name}::n1", np.float32(n1))], f"{node.name}::a")
        summed = self.emit("Add", [scaled, names[1]], f"{node.name}::ab")
        index = self.emit("Add", [summed, self.const(f"{node.name}::off", np.float32(-low[0] * n1 - low[1]))],
                          f"{node.name}::ix")
        self._gather(node, index, table.reshape(-1), f"table {table.size}")

    def _elementwise_unary(self, node, k: int):
        """Add / Sub / Mul of one activation (operand ``k``) with a constant, or with
        itself: a table per element of the constant over every code of the activation,
        computed by the plain path, read with ``Gather`` at ``code + levels * j`` (j the
        constant's element, broadcast as the op broadcasts)."""
        name = node.inputs[k]
        q, yq = self.activation(node, name), self.activation(node, node.outputs[0])
        if q.dtype not in ("int8", "uint8"):
            self.report[node.name] = int64_rules.elementwise(self, node)
            return
        role = f"input{1 - k}"
        cshape = tuple(np.asarray(self.plain._int(node, role)).shape) if role in node.quant else ()
        levels = q.qmax - q.qmin + 1
        count = int(np.prod(cshape, dtype=np.int64))
        if count * levels > MAX_TABLE or count > 1 and self._one_code(node, name, role):
            return self._elementwise_by_constant_code(node, k, role, q, yq)
        codes = np.arange(q.qmin, q.qmax + 1).astype(NP_INT[q.dtype]).reshape((levels,) + (1,) * len(cshape))
        out = self.plain._elementwise(node, {name: torch.from_numpy(codes)})[0]
        self._table_per_element(node, name, q, yq, cshape, out, "over one operand")

    def _table_per_element(self, node, name: str, q, yq, cshape: tuple, out, what: str):
        """``out``: the plain path's output codes on every code of ``name`` (axis 0) beside each
        element of a constant of shape ``cshape``; read with ``Gather`` at ``code + levels * j``."""
        levels = q.qmax - q.qmin + 1
        count = int(np.prod(cshape, dtype=np.int64))
        out = out.numpy().astype(np.int64)
        table = np.moveaxis(np.broadcast_to(out, (levels,) + cshape), 0, -1) - int(yq.zero_point)
        index = self.emit("Add", [name, self.const(f"{node.name}::off", np.float32(int(q.zero_point) - q.qmin))],
                          f"{node.name}::code")
        if count > 1 or cshape:
            grid = (np.arange(count, dtype=np.float32) * levels).reshape(cshape)
            index = self.emit("Add", [index, self.const(f"{node.name}::grid", grid)], f"{node.name}::ix")
        self._gather(node, index, table.reshape(-1), f"table {table.size} {what}")

    def _divide(self, node):
        """Div by an activation (quant/div_rule.py): a table of every pair of 8-bit codes, or with a
        constant operand a table per element of it over every code of the activation."""
        from ..quant.div_rule import integer_forward

        yq = self.activation(node, node.outputs[0])
        consts = [k for k in range(2) if f"input{k}" in node.quant]
        k = 1 - consts[0] if consts else 0
        qs = [self.activation(node, n) for n in node.inputs[:2] if n not in (node.inputs[j] for j in consts)]
        if any(q.dtype not in ("int8", "uint8") for q in qs):
            self.refuse(node, "an operand that is not 8-bit (a table of every code)")
        if not consts and len(set(node.inputs[:2])) == 2:
            return self._pair_table(node, qs, yq, lambda n, env: integer_forward(self.plain, n, env))
        name, q = node.inputs[k], qs[0]
        cshape = tuple(np.asarray(self.plain._int(node, f"input{consts[0]}")).shape) if consts else ()
        levels = q.qmax - q.qmin + 1
        if int(np.prod(cshape, dtype=np.int64)) * levels > MAX_TABLE:
            self.refuse(node, f"a constant operand of {int(np.prod(cshape))} elements (a table per element)")
        codes = np.arange(q.qmin, q.qmax + 1).astype(NP_INT[q.dtype]).reshape((levels,) + (1,) * len(cshape))
        out = integer_forward(self.plain, node, {name: torch.from_numpy(codes)})[0]
        self._table_per_element(node, name, q, yq, cshape, out, "over one operand")

    def _prelu(self, node):
        """PRelu (quant/prelu_rule.py): a table per element of the slope over every code of x,
        the plain rule's own results (per-channel slopes: one table per channel)."""
        from ..quant.prelu_rule import integer_forward

        name = node.inputs[0]
        q, yq = self.activation(node, name), self.activation(node, node.outputs[0])
        cshape = tuple(self.graph.values[node.inputs[1]].shape)
        levels = q.qmax - q.qmin + 1
        if q.dtype not in ("int8", "uint8") or int(np.prod(cshape, dtype=np.int64)) * levels > MAX_TABLE:
            self.refuse(node, f"its input is {q.dtype} or its slope has {int(np.prod(cshape))} elements (a table "
                              f"of every code per slope element)")
        codes = np.arange(q.qmin, q.qmax + 1).astype(NP_INT[q.dtype]).reshape((levels,) + (1,) * len(cshape))
        out = integer_forward(self.plain, node, {name: torch.from_numpy(codes)})[0]
        self._table_per_element(node, name, q, yq, cshape, out, "over the input, per slope element")

    def _one_code(self, node, name: str, role: str) -> bool:
        """Whether the constant operand ``role`` is one code throughout (xcit's zero qkv bias) and broadcasts
        into the activation ``name`` without widening it: then one table of its codes serves every element."""
        codes = np.asarray(self.plain._int(node, role))
        shape = self.graph.values[name].shape
        return bool((codes == codes.flat[0]).all()) and codes.ndim <= len(shape) and \
            all(c == 1 or c == d for c, d in zip(codes.shape[::-1], shape[::-1]))

    def _elementwise_by_constant_code(self, node, k: int, role: str, q, yq):
        """A constant too large for a table per element (a position embedding) holds few
        distinct codes: one table per distinct code over every code of the activation, the
        plain path's results on them, read at ``code * distinct + rank of the element's code``
        (one code that broadcasts into the activation's shape: at the code alone)."""
        name = node.inputs[k]
        codes = np.asarray(self.plain._int(node, role))
        distinct, rank = np.unique(codes, return_inverse=True)
        levels = q.qmax - q.qmin + 1
        if distinct.size * levels > MAX_TABLE:
            self.refuse(node, f"a constant of {codes.size} elements and {distinct.size} distinct codes "
                              f"(table of {distinct.size * levels} entries)")
        # the plain rule on the distinct codes: given as the constant operand's codes, which the
        # rule reads from its inputs once the node's stored copy (``role``) is out of the way
        probe = dataclasses.replace(node, quant={r: v for r, v in node.quant.items() if r != role})
        column = np.arange(q.qmin, q.qmax + 1).astype(NP_INT[q.dtype]).reshape(levels, 1)
        feeds = {name: torch.from_numpy(column), node.inputs[1 - k]: torch.from_numpy(distinct.astype(codes.dtype))}
        out = self.plain._elementwise(probe, feeds)[0].numpy().astype(np.int64)
        table = np.broadcast_to(out, (levels, distinct.size)) - int(yq.zero_point)
        index = self.emit("Add", [name, self.const(f"{node.name}::off", np.float32(int(q.zero_point) - q.qmin))],
                          f"{node.name}::code")
        if distinct.size > 1 or not self._one_code(node, name, role):
            index = self.emit("Mul", [index, self.const(f"{node.name}::distinct", np.float32(distinct.size))],
                              f"{node.name}::row")
            ranks = self.const(f"{node.name}::rank", rank.reshape(codes.shape).astype(np.float32))
            index = self.emit("Add", [index, ranks], f"{node.name}::ix")
        self._gather(node, index, table.reshape(-1),
                     f"table {table.size} over one operand and the constant's {distinct.size} distinct codes")

    def _pool(self, node):
        g = self.graph
        xq, yq = self.activation(node, node.inputs[0]), self.activation(node, node.outputs[0])
        shape = g.values[node.inputs[0]].shape
        if node.op == "GlobalAveragePool":
            axes, keep = list(range(2, len(shape))), 1
        elif node.op in ("ReduceMean", "ReduceSum"):
            axes_name = node.inputs[1] if len(node.inputs) > 1 else ""
            axes = [int(a) % len(shape) for a in np.asarray(g.values[axes_name].data).reshape(-1)] if axes_name \
                else []
            if not axes and node.attrs["noop_with_empty_axes"]:
                self.refuse(node, "an empty-axes no-op")
            axes, keep = axes or list(range(len(shape))), int(node.attrs["keepdims"])
        else:
            return self._window_pool(node, xq, yq, shape)
        dims = [shape[a] for a in axes]
        if not all(isinstance(d, int) for d in dims):
            self.refuse(node, "pooling over dynamic dimensions")
        count = int(np.prod(dims))
        low, high = count * (xq.qmin - int(xq.zero_point)), count * (xq.qmax - int(xq.zero_point))
        if high - low + 1 > MAX_TABLE:
            self.refuse(node, f"{count} elements per window (table of {high - low + 1} sums)")
        sums = torch.arange(low, high + 1, dtype=torch.int64)
        out = self.plain.pool_output(node, sums, torch.tensor(count))
        table = out.clamp(yq.qmin, yq.qmax).numpy() - int(yq.zero_point)
        total = self.emit("ReduceSum", [node.inputs[0], self.const(f"{node.name}::axes", np.int64(axes))],
                          f"{node.name}::sum", keepdims=keep)
        index = self.emit("Add", [total, self.const(f"{node.name}::off", np.float32(-low))], f"{node.name}::ix")
        self._gather(node, index, table, f"sum + table {table.size}")

    def _window_pool(self, node, xq, yq, shape):
        """AveragePool: exact window sums (the op's explicit padding, then a depthwise
        convolution with ones, in float32), then one table per distinct window count
        (the counts differ at the borders), indexed at ``sum + offset[position]``."""
        if not all(isinstance(d, int) for d in shape):
            self.refuse(node, "pooling over dynamic dimensions")
        op, a = get_op("AveragePool"), node.attrs
        channels, nsp = shape[1], len(shape) - 2
        _, counts = op.window_sums(node, torch.zeros((1, channels, *shape[2:]), dtype=torch.float64))
        counts = counts.to(torch.int64).numpy()  # [1, 1, *out]
        low, high = xq.qmin - int(xq.zero_point), xq.qmax - int(xq.zero_point)
        tables, offsets = [], np.zeros(counts.shape, np.int64)
        base = 0
        for c in np.unique(counts):
            sums = torch.arange(int(c) * low, int(c) * high + 1, dtype=torch.int64)
            tables.append(self.plain.pool_output(node, sums, torch.tensor(int(c))).clamp(yq.qmin, yq.qmax).numpy())
            offsets[counts == c] = base - int(c) * low
            base += len(sums)
        if base > MAX_TABLE or int(counts.max()) * max(-low, high) >= 2**24:
            self.refuse(node, f"windows of up to {int(counts.max())} elements (table of {base} sums)")
        pads = op.exact_pads(node, tuple(shape))
        onnx_pads = [0, 0] + pads[:nsp] + [0, 0] + pads[nsp:]
        padded = self.emit("Pad", [node.inputs[0], self.const(f"{node.name}::pads", np.int64(onnx_pads))],
                           f"{node.name}::padded")
        ones = self.const(f"{node.name}::ones", np.ones((channels, 1, *a["kernel_shape"]), np.float32))
        total = self.emit("Conv", [padded, ones], f"{node.name}::sum", group=channels, kernel_shape=a["kernel_shape"],
                          strides=a["strides"], dilations=a["dilations"], pads=[0] * (2 * nsp))
        index = self.emit("Add", [total, self.const(f"{node.name}::off", offsets.astype(np.float32))],
                          f"{node.name}::ix")
        table = np.concatenate(tables) - int(yq.zero_point)
        self._gather(node, index, table, f"window sums + {len(tables)} tables ({table.size})")

    def _minmax(self, node):
        """Max / Min / Where of activations, a Clip with computed bounds (quant/minmax_rule.py): each
        operand's requantization to the output grid read from a table of every code (the plain
        path's own rule), a constant operand its stored codes; then the maximum, minimum or
        selection, saturated to the output's range."""
        yq = self.activation(node, node.outputs[0])
        zp = int(yq.zero_point)
        operands = []
        for k, name in enumerate(node.inputs):
            if not name or (node.op == "Where" and k == 0):
                operands.append(name)
                continue
            if f"input{k}" in node.quant:
                codes = np.asarray(self.plain._int(node, f"input{k}"), np.int64) - zp
                operands.append(self.const(f"{node.name}::input{k}", codes.astype(np.float32)))
                continue
            q = self.activation(node, name)
            if q.dtype not in ("int8", "uint8"):
                self.refuse(node, f"operand '{name}' is {q.dtype} (a table of every code is 8-bit)")
            env = {name: torch.from_numpy(np.arange(q.qmin, q.qmax + 1).astype(NP_INT[q.dtype]))}
            table = minmax_operand(self.plain, node, k, env).numpy() - zp
            index = self.emit("Add", [name, self.const(f"{node.name}::off{k}", np.float32(int(q.zero_point) - q.qmin))],
                              f"{node.name}::ix{k}")
            idx = self.emit("Cast", [index], f"{node.name}::idx{k}", to=TensorProto.INT32)
            operands.append(self.lookup(self.const(f"{node.name}::table{k}", table.astype(np.float32)), idx,
                                        f"{node.name}::t{k}", like=name))
        if node.op == "Where":
            y = self.emit("Where", operands, f"{node.name}::y")
        else:
            steps = [("Max", 1), ("Min", 2)] if node.op == "Clip" else [(node.op, k) for k in range(1, len(operands))]
            y = operands[0]
            for op, k in steps:
                if k < len(operands) and operands[k]:
                    y = self.emit(op, [y, operands[k]], f"{node.name}::{op.lower()}{k}")
        self.emit("Clip", [y, self.const(f"{node.name}::lo", np.float32(yq.qmin - zp)),
                           self.const(f"{node.name}::hi", np.float32(yq.qmax - zp))], node.outputs[0])
        self.report[node.name] = "operand tables, then " + ("Where" if node.op == "Where" else "max / min")

    def _lut(self, node):
        xq, yq = self.activation(node, node.inputs[0]), self.activation(node, node.outputs[0])
        table = self.plain._table(node).numpy() - int(yq.zero_point)
        off = self.const(f"{node.name}::off", np.float32(int(xq.zero_point) - xq.qmin))
        self._gather(node, self.emit("Add", [node.inputs[0], off], f"{node.name}::ix"), table, "table")
