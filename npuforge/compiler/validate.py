"""What the program simulator relies on, checked when a program is read (after its layout,
npuforge/compiler/binfmt.py) and before anything is computed or allocated: a crafted or
buggy ``.npub`` whose checksums are valid is refused in one line naming the file, the
section, the record and the field, instead of crashing a kernel or allocating without bound.

* TENSORS: every dimension at least 1, rows held 1..height, a positive finite scale, a zero
  point the dtype holds, and every tensor within the SRAM a program may address
  (:data:`MAX_SRAM_BYTES`, far above any NPU's; the compiler refuses a bigger program).
* IO: at least one input and one output, each a whole tensor whose NCHW dims are its geometry.
* COMMANDS: the opcode's input count, rows inside the output, SRAM addresses inside the
  arena, a complete parameter block (every entry the kernel reads, scalar or sized as the
  kernel indexes it, in range), the tensor shapes the kernel combines, a weight block of a
  known codec decoding to exactly the weights the shapes need, and at most :data:`MAX_WORK`
  elements in any array the kernel builds for the stripe.
* META: a JSON object; a preprocessing record, when present, with every field an image
  input is prepared with.
"""

from __future__ import annotations

import math

from ..errors import ModelFormatError
from ..zoo.transforms import preprocess_problem
from .binfmt import MAX_INPUTS, MEMORIES, NODE_OPCODES, QRANGE, ProgramImage, decode_params
from .kernels import needed_rows
from .weights import block_problem

MAX_SRAM_BYTES = 64 << 20  # SRAM a program may address: NPUs have a few MiB (and the most one tensor may take)
MAX_DRAM_BYTES = 1 << 30  # DRAM its spilled tensors may take
MAX_WORK = 1 << 26  # elements of the largest array one command builds (its stripe, im2col, padded rows)
MAX_TAPS = 1 << 16  # kernel_h x kernel_w of a window

WINDOWED = ("conv", "depthwise", "avgpool", "maxpool")
WEIGHTED = ("conv", "depthwise", "fully_connected")
WINDOW = ("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w", "pad_top", "pad_left")
COMPUTE = ("zp_in", "zp_out")
PER_CHANNEL = ("bias", "multiplier", "shift", "act_min", "act_max")
ADD = ("zp_in0", "zp_in1", "zp_out", "mode", "left_shift", "multiplier0", "shift0", "multiplier1", "shift1")
# scalars every command of an opcode reads (conditional ones are checked in _params)
SCALARS = {"conv": WINDOW + COMPUTE + ("group",), "depthwise": WINDOW + COMPUTE, "fully_connected": COMPUTE,
           "add": ADD, "sub": ADD, "mul": ("zp_in0", "zp_in1", "zp_out", "multiplier", "shift"),
           "avgpool": WINDOW + COMPUTE, "global_avgpool": COMPUTE, "maxpool": WINDOW, "lut": ("qmin",),
           "concat": (), "resize_bilinear": ("code_shift",)}
AT_LEAST = {"kernel_h": 1, "kernel_w": 1, "stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1,
            "pad_top": 0, "pad_left": 0, "group": 1}
FLAGS = ("single_rounding", "code_average", "mode")  # 0 or 1


class _Bad(Exception):
    """A field out of range; validate() adds the file and the record to the message."""


def validate(img: ProgramImage, where: str) -> None:
    """Raise ModelFormatError (one line) for the first field of ``img`` the simulator cannot take;
    sets ``img.arena`` and ``img.blocks`` (the decoded parameter blocks)."""
    for k, t in enumerate(img.tensors):
        _check(where, f"TENSORS record {k} ('{t.name}')", _tensor, t)
    img.arena = max((t.offset + t.ring_rows * t.row_bytes for t in img.tensors if not t.memory), default=0)
    img.dram_arena = max((t.offset + t.h * t.row_bytes for t in img.tensors if t.memory), default=0)
    for direction, items in (("input", img.inputs), ("output", img.outputs)):
        if not items:
            raise ModelFormatError(f"{where}: IO: the program declares no {direction}")
        for j, (t, shape) in enumerate(items):
            _check(where, f"IO {direction} {j} ('{img.tensors[t].name}')", _io, img.tensors[t], shape)
    for k, c in enumerate(img.commands):
        _check(where, f"COMMANDS command {k} ({c.kind})", _command, img, c)
    _check(where, "META", _meta, img)


def _arena(img: ProgramImage, rec) -> int:
    return img.dram_arena if rec.memory else img.arena


def _check(where: str, record: str, fn, *args) -> None:
    try:
        fn(*args)
    except _Bad as e:
        raise ModelFormatError(f"{where}: {record}: {e}") from None


# -- tensors and IO -----------------------------------------------------------------------------
def _tensor(t) -> None:
    for name, v in (("height", t.h), ("width", t.w), ("channels", t.c)):
        if v < 1:
            raise _Bad(f"{name} {v}; every dimension is at least 1")
    if not 1 <= t.ring_rows <= t.h:
        raise _Bad(f"rows held {t.ring_rows}; must be 1..{t.h} (its height)")
    if t.memory and t.ring_rows != t.h:
        raise _Bad(f"a rolling buffer ({t.ring_rows} of {t.h} rows) in DRAM; a spilled tensor is whole")
    size = t.h * t.row_bytes
    limit = MAX_DRAM_BYTES if t.memory else MAX_SRAM_BYTES
    if size > MAX_SRAM_BYTES or t.offset + t.ring_rows * t.row_bytes > limit:
        raise _Bad(f"{t.h} x {t.w} x {t.c} {t.dtype} ({size} bytes) at {MEMORIES[t.memory]} offset {t.offset}; a "
                   f"program addresses at most {limit} bytes there ({MAX_SRAM_BYTES} per tensor)")
    if not (math.isfinite(t.scale) and t.scale > 0):
        raise _Bad(f"scale {t.scale}; must be a positive number")
    lo, hi = QRANGE.get(t.dtype, (0, 0))  # a float or index tensor has no codes: zero point 0
    if not lo <= t.zero_point <= hi:
        raise _Bad(f"zero point {t.zero_point} outside {t.dtype}'s {lo}..{hi}")


def _io(t, shape) -> None:
    """A 4-D value is its H x W x C tensor, a 3-D one [1, L, D] 1 x L x D; any other rank is flat:
    1 x 1 x its element count."""
    if len(shape) == 4:
        ok = tuple(shape) == (1, t.c, t.h, t.w)
    elif len(shape) == 3 and shape[0] == 1:
        ok = tuple(shape) == (1, t.w, t.c) and t.h == 1
    else:
        ok = t.h == t.w == 1 and math.prod(shape) == t.c and (len(shape) < 2 or shape[0] == 1)
    if not ok:
        raise _Bad(f"dims {list(shape)}, but its tensor is {t.h} x {t.w} x {t.c} (H x W x C)")
    if t.ring_rows != t.h:
        raise _Bad(f"a rolling buffer ({t.ring_rows} of {t.h} rows); program inputs and outputs are whole")


# -- commands -------------------------------------------------------------------------------------
def _command(img: ProgramImage, c) -> None:
    out = img.tensors[c.output[0]]
    srcs = [img.tensors[t] for t, _ in c.inputs]
    if c.kind in NODE_OPCODES:
        return _node_command(img, c, out, srcs)
    for role, rec in [("output", out)] + [(f"input {j}", s) for j, s in enumerate(srcs)]:
        if rec.dtype not in QRANGE:
            raise _Bad(f"{role} '{rec.name}' is {rec.dtype}; an NPU kernel reads and writes codes ("
                       f"{', '.join(QRANGE)})")
    arity = (1, MAX_INPUTS) if c.kind == "concat" else (2, 2) if c.kind in ("add", "sub", "mul") else (1, 1)
    if not arity[0] <= len(srcs) <= arity[1]:
        raise _Bad(f"{len(srcs)} inputs; {c.kind} takes {arity[0] if arity[0] == arity[1] else f'1..{MAX_INPUTS}'}")
    if c.rows < 1 or c.row0 + c.rows > out.h:
        raise _Bad(f"writes rows {c.row0}..{c.row0 + c.rows} of a {out.h}-row tensor")
    for role, (t, off) in [("output", c.output)] + [(f"input {j}", pair) for j, pair in enumerate(c.inputs)]:
        rec = img.tensors[t]
        if off + rec.ring_rows * rec.row_bytes > _arena(img, rec):
            raise _Bad(f"{role} at {MEMORIES[rec.memory]} offset {off} ends past the program's {_arena(img, rec)}-byte "
                       f"arena")
    p = _block(img, c)
    if any(isinstance(v, bytes) for v in p.values()):
        raise _Bad("a byte entry in the parameter block of a kernel operation (only node commands hold one)")
    _params(c.kind, p, srcs, out)
    _shapes(c.kind, p, srcs, out)
    _weights(img, c, p, srcs, out)
    _work(c, p, srcs, out)


def _node_command(img: ProgramImage, c, out, srcs) -> None:
    """A command running an IR node: whole tensors in and out, each the size and type of the node's
    value (checked against the node the block holds), and no weight block."""
    from .cpu import decode_node, value_layout

    for role, (t, off) in [("output", c.output)] + [(f"input {j}", pair) for j, pair in enumerate(c.inputs)]:
        rec = img.tensors[t]
        if rec.ring_rows != rec.h or off + rec.h * rec.row_bytes > _arena(img, rec):
            raise _Bad(f"{role}: a node command reads and writes whole tensors inside the arena")
    if c.row0 != 0 or c.rows != out.h:
        raise _Bad(f"writes rows {c.row0}..{c.row0 + c.rows}; a node command writes all {out.h}")
    if c.weights[1] or c.weights[3]:
        raise _Bad("a weight block for a node command (its constants are in its parameter block)")
    p = _block(img, c)
    if not isinstance(p.get("node"), bytes):
        raise _Bad("parameter block lacks its 'node'")
    index = _scalar(p, "output_index")
    if p["node"] not in img.nodes:
        try:
            img.nodes[p["node"]] = decode_node(p["node"], "its node")
        except ModelFormatError as e:
            raise _Bad(str(e)) from None
    graph = img.nodes[p["node"]]
    if len(graph.inputs) != len(srcs) or not 0 <= index < len(graph.outputs):
        raise _Bad(f"{len(srcs)} inputs and output {index}; its node has {len(graph.inputs)} inputs and "
                   f"{len(graph.outputs)} outputs")
    for role, name, rec in [("output", graph.outputs[index], out)] + [
            (f"input {j}", n, s) for j, (n, s) in enumerate(zip(graph.inputs, srcs))]:
        layout = value_layout(graph.values[name])
        if layout != (rec.dtype, rec.h, rec.w, rec.c):
            raise _Bad(f"{role} is {rec.h} x {rec.w} x {rec.c} {rec.dtype}; its node's value '{name}' is "
                       f"{layout[1]} x {layout[2]} x {layout[3]} {layout[0]}")
        if rec.h * rec.w * rec.c > MAX_WORK:
            raise _Bad(f"{role} holds {rec.h * rec.w * rec.c} elements; a command may build at most {MAX_WORK}")


def _block(img: ProgramImage, c) -> dict:
    """The command's parameter block, decoded once (commands may share one)."""
    if c.params not in img.blocks:
        off, length = c.params
        try:
            img.blocks[c.params] = decode_params(img.params[off:off + length], "parameter block")
        except ModelFormatError as e:
            raise _Bad(str(e)) from None
    return img.blocks[c.params]


def _scalar(p: dict, name: str) -> int:
    if name not in p:
        raise _Bad(f"parameter block lacks '{name}'")
    if not isinstance(p[name], int):
        got = f"{len(p[name])} bytes" if isinstance(p[name], bytes) else f"an array of {p[name].size}"
        raise _Bad(f"parameter '{name}' is {got}; a scalar expected")
    return p[name]


def _array(p: dict, name: str, sizes: tuple, what: str, scalar_ok: bool = False):
    v = p.get(name)
    if v is None:
        raise _Bad(f"parameter block lacks '{name}'")
    if isinstance(v, int) and scalar_ok:
        return v
    if isinstance(v, int) or v.size not in sizes:
        got = "a scalar" if isinstance(v, int) else f"{v.size} values"
        raise _Bad(f"parameter '{name}' holds {got}; {what} expected")
    return v


def _params(kind: str, p: dict, srcs: list, out) -> None:
    for name in SCALARS[kind]:
        v = _scalar(p, name)
        if name in AT_LEAST and v < AT_LEAST[name]:
            raise _Bad(f"parameter '{name}' is {v}; must be at least {AT_LEAST[name]}")
    for name in FLAGS:
        if name in p and _scalar(p, name) not in (0, 1):
            raise _Bad(f"parameter '{name}' is {p[name]}; must be 0 or 1")
    if kind in WINDOWED and p["kernel_h"] * p["kernel_w"] > MAX_TAPS:
        raise _Bad(f"a {p['kernel_h']} x {p['kernel_w']} window; at most {MAX_TAPS} taps")
    if kind in WEIGHTED:
        channel = ((1, out.c), f"1 or {out.c} (one per output channel)")
        for name in PER_CHANNEL + (("multiplier_neg", "shift_neg") if "multiplier_neg" in p else ()):
            _array(p, name, *channel, scalar_ok=True)
    elif kind in ("add", "sub") and p["mode"] == 1:  # TFLite's ADD: an output multiplier too
        for name in ("multiplier_out", "shift_out"):
            _scalar(p, name)
    elif kind in ("avgpool", "global_avgpool"):
        n = out.h * out.w if kind == "avgpool" else 1
        names = ("count",) if p.get("code_average") else ("count", "divisor")
        for name in names:
            if (_array(p, name, (n,), f"{n} (one per output position)") < 1).any():
                raise _Bad(f"parameter '{name}' has a value below 1")
        if not p.get("code_average"):
            for name in ("multiplier", "shift"):
                _scalar(p, name)
            if not 0 <= _scalar(p, "extra_bits") <= 31:
                raise _Bad(f"parameter 'extra_bits' is {p['extra_bits']}; must be 0..31")
    elif kind == "lut":
        lo, hi = QRANGE[srcs[0].dtype]  # the table is indexed by code - qmin
        if p["qmin"] > lo:
            raise _Bad(f"parameter 'qmin' is {p['qmin']}; the table must cover {srcs[0].dtype}'s codes {lo}..{hi}")
        _array(p, "table", (hi - p["qmin"] + 1,), f"{hi - p['qmin'] + 1} (codes {p['qmin']}..{hi})")
    elif kind == "resize_bilinear":
        src = srcs[0]
        for axis, n, limit in (("row", out.h, src.h), ("col", out.w, src.w)):
            lo_, hi_, _, _ = (_array(p, f"{axis}_{e}", (n,), f"{n} (one per output {axis})")
                              for e in ("lo", "hi", "w0", "w1"))
            if (lo_ < 0).any() or (hi_ >= limit).any() or (lo_ > hi_).any():
                raise _Bad(f"parameters '{axis}_lo' / '{axis}_hi' must satisfy 0 <= lo <= hi < {limit} (the input's "
                           f"{'rows' if axis == 'row' else 'columns'})")


def _shapes(kind: str, p: dict, srcs: list, out) -> None:
    """The tensor geometry each kernel combines (what the lowering guarantees)."""
    src = srcs[0]

    def need(ok: bool, what: str):
        if not ok:
            raise _Bad(f"{what} (input {' / '.join(f'{s.h} x {s.w} x {s.c}' for s in srcs)}, output "
                       f"{out.h} x {out.w} x {out.c})")

    if kind == "conv":
        need(src.c % p["group"] == 0 and out.c % p["group"] == 0,
             f"group {p['group']} does not divide both channel counts")
    elif kind in ("depthwise", "avgpool", "maxpool", "resize_bilinear"):
        need(src.c == out.c, "input and output channels differ")
    elif kind in ("fully_connected", "global_avgpool"):
        need(out.h == out.w == 1 and (kind == "global_avgpool" or src.h == src.w == 1), "not a 1 x 1 tensor")
        need(kind == "fully_connected" or src.c == out.c, "input and output channels differ")
    elif kind in ("add", "sub", "mul", "lut"):
        need(all(d in (1, o) for s in srcs for d, o in zip((s.h, s.w, s.c), (out.h, out.w, out.c))),
             "an input does not broadcast to the output")
    elif kind == "concat":
        need(all((s.h, s.w) == (out.h, out.w) for s in srcs) and sum(s.c for s in srcs) == out.c,
             "inputs' H and W differ from the output's or their channels do not add up to its")


def _weights(img: ProgramImage, c, p: dict, srcs: list, out) -> None:
    off, length, codec, count = c.weights
    if c.kind not in WEIGHTED:
        if length or count:
            raise _Bad(f"a weight block ({length} bytes, {count} weights) for an operation without weights")
        return
    src = srcs[0]
    if c.kind == "conv":
        expect = out.c * p["kernel_h"] * p["kernel_w"] * (src.c // p["group"])
    elif c.kind == "depthwise":
        expect = p["kernel_h"] * p["kernel_w"] * out.c
    else:
        expect = out.c * src.c
    if count != expect:
        raise _Bad(f"decoded weight count {count}; its shapes need {expect}")
    problem = block_problem(codec, img.weights[off:off + length], count)
    if problem:
        raise _Bad(f"weight block at {off} {problem}")


def _work(c, p: dict, srcs: list, out) -> None:
    """The largest array the kernels build for this stripe (read rows, padded rows, im2col)."""
    a, b = c.row0, c.row0 + c.rows
    work = c.rows * out.w * out.c
    for j, src in enumerate(srcs):
        lo, hi = needed_rows(c.kind, p, a, b, src.h, j)
        width = src.w
        if c.kind in WINDOWED:
            width = max(src.w + p["pad_left"], (out.w - 1) * p["stride_w"] + (p["kernel_w"] - 1) * p["dilation_w"] + 1)
        work = max(work, (hi - lo) * width * src.c)
    if c.kind == "conv":
        work = max(work, c.rows * out.w * p["kernel_h"] * p["kernel_w"] * (srcs[0].c // p["group"]))
    if work > MAX_WORK:
        raise _Bad(f"rows {a}..{b} need arrays of {work} elements; a command may build at most {MAX_WORK}")


# -- META -----------------------------------------------------------------------------------------
def _meta(img: ProgramImage) -> None:
    """The preprocessing record an image input is prepared with (npuforge/workflow.py transform_of)."""
    pre = img.meta.get("preprocess")
    if pre is None:
        return
    problem = preprocess_problem(pre)
    if problem:
        raise _Bad(problem)
