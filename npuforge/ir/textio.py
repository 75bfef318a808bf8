"""The IR on disk: a text graph a person can read and diff, plus a safetensors
weights file beside it. No pickle.

    npuforge-ir 1
    graph "efficientnet_lite0"
    weights "model.safetensors" sha256 9f2c...
    input x: float32[N,3,224,224]
    const stem.weight: float32[32,3,3,3]
    const axes: int64[2] = [2, 3]
    node stem = Conv(x, stem.weight, stem.bias) -> y: float32[N,32,112,112] {"dilations": [1, 1], ...}
    output logits
    quant x {"axis": null, "dtype": "uint8", "scale": 0.0157, "zero_point": 128}
    qnode stem {"bias": "stem::bias_q", "multiplier": "stem::multiplier", ...}
    meta {"preprocess": {...}}

Names that are not plain ``[A-Za-z0-9_./+*-]`` are written as JSON strings.
Constants of at most 16 elements are written inline. Saving is deterministic:
save -> load -> save gives identical bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError
from . import dtypes
from .graph import Graph, Node, Value
from .infer import check_size

# Bounds on what the reader reads: the text graph (constants above 16 elements live in the weights
# file, so even a large model's text is a few MB) and the safetensors header (its own format's limit).
MAX_TEXT_BYTES = 256 << 20
MAX_HEADER_BYTES = 100 << 20

MAGIC = "npuforge-ir 1"
INLINE_LIMIT = 16
_BARE = re.compile(r"[A-Za-z0-9_./+*\-]+\Z")
_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|(->)|([A-Za-z0-9_./+*\-]+)|([:,()\[\]=]))')


def weights_path(path: Path) -> Path:
    return path.with_suffix(".safetensors")


def _name(s: str) -> str:
    return s if _BARE.match(s) else json.dumps(s)


def _decl(v: Value) -> str:
    dims = ",".join(str(d) if isinstance(d, int) else _name(d) for d in v.shape)
    return f"{_name(v.name)}: {v.dtype}[{dims}]"


def _json(obj) -> str:
    return json.dumps(obj, sort_keys=True)


def dumps(graph: Graph, weights_name: str, weights_sha: str) -> str:
    lines = [MAGIC, f"graph {json.dumps(graph.name)}", f"weights {json.dumps(weights_name)} sha256 {weights_sha}"]
    for name in graph.inputs:
        lines.append(f"input {_decl(graph.values[name])}")
    for v in graph.constants():
        line = f"const {_decl(v)}"
        if v.data.size <= INLINE_LIMIT:
            line += f" = {_json(v.data.tolist())}"
        lines.append(line)
    for n in graph.nodes:
        ins = ", ".join(_name(i) for i in n.inputs)
        outs = ", ".join(_decl(graph.values[o]) for o in n.outputs)
        lines.append(f"node {_name(n.name)} = {n.op}({ins}) -> {outs} {_json(n.attrs)}")
    for name in graph.outputs:
        lines.append(f"output {_name(name)}")
    declared = [*graph.inputs, *(v.name for v in graph.constants()), *(o for n in graph.nodes for o in n.outputs)]
    for name in declared:  # the order of the declarations above, so a reload writes the same bytes
        if graph.values[name].quant is not None:
            lines.append(f"quant {_name(name)} {_json(graph.values[name].quant.to_json())}")
    for n in graph.nodes:
        if n.quant:
            lines.append(f"qnode {_name(n.name)} {_json(n.quant)}")
    if graph.metadata:
        lines.append(f"meta {_json(graph.metadata)}")
    return "\n".join(lines) + "\n"


def save(graph: Graph, path) -> None:
    """Write the text graph at ``path`` and its weights at ``path`` with suffix .safetensors."""
    from safetensors.numpy import save as save_tensors

    path = Path(path)
    wpath = weights_path(path)
    big = {v.name: v.data.copy(order="C") for v in graph.constants() if v.data.size > INLINE_LIMIT}
    blob = save_tensors(big) if big else save_tensors({})
    text = dumps(graph, wpath.name, hashlib.sha256(blob).hexdigest())
    path.parent.mkdir(parents=True, exist_ok=True)
    wpath.write_bytes(blob)
    path.write_text(text, encoding="utf-8")


class _Line:
    """A tiny tokenizer/parser for one line of the text format."""

    def __init__(self, text: str, where: str, declared: set):
        self.text, self.pos, self.where = text, 0, where
        self.declared = declared  # the value names of the lines before

    def error(self, msg: str):
        raise ModelFormatError(f"{self.where}: {msg} (at column {self.pos + 1})")

    def peek(self) -> str | None:
        m = _TOKEN.match(self.text, self.pos)
        return m.group(0).strip() if m else None

    def token(self) -> str:
        m = _TOKEN.match(self.text, self.pos)
        if not m:
            self.error("unexpected text")
        self.pos = m.end()
        quoted, arrow, bare, punct = m.groups()
        return json.loads(quoted) if quoted else (bare or arrow or punct)

    def expect(self, tok: str):
        if self.token() != tok:
            self.error(f"expected '{tok}'")

    def name(self) -> str:
        m = _TOKEN.match(self.text, self.pos)
        if not m or not (m.group(1) or m.group(3)):
            self.error("expected a name")
        return self.token()

    def decl(self) -> tuple[str, str, tuple]:
        name = self.name()
        self.expect(":")
        dtype = self.token()
        if dtype not in dtypes.DTYPES:
            self.error(f"unknown dtype '{dtype}'")
        self.expect("[")
        dims = []
        while self.peek() != "]":
            d = self.token()
            if re.fullmatch(r"-\d+", d):
                self.error(f"dimension {d} of '{name}' is negative")
            dims.append(int(d) if re.fullmatch(r"\d+", d) else d)
            if self.peek() == ",":
                self.token()
        self.expect("]")
        check_size(name, dims, self.where)  # before any constant of that shape is built
        if name in self.declared:
            self.error(f"value '{name}' is declared twice")
        self.declared.add(name)
        return name, dtype, tuple(dims)

    def rest(self) -> str:
        return self.text[self.pos:].strip()

    def json_object(self, what: str) -> dict:
        """The rest of the line as a JSON object (attributes, a qnode's roles, meta)."""
        obj = json.loads(self.rest())
        if not isinstance(obj, dict):
            self.error(f"{what} must be a JSON object {{...}}, not {type(obj).__name__}")
        return obj


def loads(text: str, where: str, weights: dict) -> Graph:
    lines = text.splitlines()
    if not lines or lines[0].strip() != MAGIC:
        raise ModelFormatError(f"{where}: not an npuforge IR file (first line should be '{MAGIC}')")
    graph = Graph()
    declared: set[str] = set()
    for lineno, raw in enumerate(lines[1:], start=2):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        kind, _, body = raw.strip().partition(" ")
        p = _Line(body, f"{where}:{lineno}", declared)
        try:
            if kind == "graph":
                graph.name = p.name()
            elif kind == "weights":
                pass
            elif kind == "input":
                name, dtype, shape = p.decl()
                graph.add_value(Value(name, dtype, shape))
                graph.inputs.append(name)
            elif kind == "const":
                name, dtype, shape = p.decl()
                if p.peek() == "=":
                    p.token()
                    data = np.array(json.loads(p.rest()), dtype=dtypes.to_numpy(dtype)).reshape(shape)
                elif name in weights:
                    data = weights[name]
                else:
                    p.error(f"constant '{name}' is missing from the weights file")
                if data.dtype != dtypes.to_numpy(dtype) or tuple(data.shape) != shape:
                    p.error(f"constant '{name}' in the weights file is {data.dtype}{list(data.shape)}, "
                            f"not {dtype}{list(shape)}")
                graph.add_value(Value(name, dtype, shape, data))
            elif kind == "node":
                name = p.name()
                p.expect("=")
                op = p.name()
                p.expect("(")
                inputs = []
                while p.peek() != ")":
                    inputs.append(p.name())
                    if p.peek() == ",":
                        p.token()
                p.expect(")")
                p.expect("->")
                outputs = []
                while True:
                    oname, dtype, shape = p.decl()
                    graph.add_value(Value(oname, dtype, shape))
                    outputs.append(oname)
                    if p.peek() != ",":
                        break
                    p.token()
                attrs = p.json_object("the node's attributes")
                graph.nodes.append(Node(name, op, inputs, outputs, attrs))
            elif kind == "output":
                graph.outputs.append(p.name())
            elif kind == "quant":
                from ..quant.params import QParams

                name = p.name()
                if name not in graph.values:
                    p.error(f"quant line for unknown value '{name}'")
                graph.values[name].quant = QParams.from_json(json.loads(p.rest()))
            elif kind == "qnode":
                name = p.name()
                node = next((n for n in graph.nodes if n.name == name), None)
                if node is None:
                    p.error(f"qnode line for unknown node '{name}'")
                roles = p.json_object("a qnode's integers")
                if not all(isinstance(v, str) for v in roles.values()):
                    p.error("a qnode's integers must name constants (strings)")
                node.quant = roles
            elif kind == "meta":
                graph.metadata = p.json_object("meta")
            else:
                raise ModelFormatError(f"{where}:{lineno}: unknown line kind '{kind}'")
        except (ValueError, KeyError, TypeError, OverflowError, json.JSONDecodeError) as e:
            raise ModelFormatError(f"{where}:{lineno}: cannot parse ({e})") from None
    return graph


def load(path) -> Graph:
    from safetensors.numpy import load as load_tensors

    path = Path(path)
    try:
        text = _read_bounded(path, MAX_TEXT_BYTES, "an IR text graph").decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelFormatError(f"{path}: cannot read ({e})") from None
    header = next((ln for ln in text.splitlines()[:4] if ln.startswith("weights ")), None)
    if header is None:
        raise ModelFormatError(f"{path}: the 'weights' line is missing")
    m = re.fullmatch(r'weights (".*") sha256 ([0-9a-f]{64})', header.strip())
    if not m:
        raise ModelFormatError(f"{path}: cannot parse the 'weights' line")
    wpath = path.parent / json.loads(m.group(1))
    if not wpath.exists():
        raise ModelFormatError(f"{path}: its weights file {wpath} is missing; keep it next to the graph")
    blob = _read_safetensors(wpath)
    if hashlib.sha256(blob).hexdigest() != m.group(2):
        raise ModelFormatError(f"{path}: the weights file {wpath} does not belong to this graph (sha256 differs)")
    try:
        weights = load_tensors(blob)
    except Exception as e:
        raise ModelFormatError(f"{wpath}: not a readable safetensors file ({e})") from None
    return loads(text, str(path), weights)


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    """A regular file's bytes, refused unread when it is larger than ``limit`` (or endless: a
    device, a pipe)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ModelFormatError(f"{path}: not a regular file; give {what}")
            if st.st_size > limit:
                raise ModelFormatError(f"{path}: {st.st_size} bytes is more than {what} holds ({limit} at most)")
            return f.read(limit + 1)[:limit]
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot read ({e.strerror or e})") from None


def _read_safetensors(path: Path) -> bytes:
    """A safetensors file read after its header's declared sizes are checked against the file's:
    8 bytes of header length, the JSON header, then exactly the tensors' bytes it declares."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ModelFormatError(f"{path}: the weights file is not a regular file")
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= min(MAX_HEADER_BYTES, st.st_size - 8):
                raise ModelFormatError(f"{path}: not a safetensors file (its header length does not fit the file)")
            try:
                header = json.loads(f.read(n))
                ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
            except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                raise ModelFormatError(f"{path}: not a safetensors file (unreadable header)") from None
            declared = 8 + n + max(ends, default=0)
            if declared != st.st_size:
                raise ModelFormatError(f"{path}: the weights file is {st.st_size} bytes but its header declares "
                                       f"{declared}; it is truncated or padded: save the model again")
            f.seek(0)
            return f.read(declared)
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot read ({e.strerror or e})") from None
