"""Output paths checked before any work, so that nothing the user gave is overwritten by accident.

Each command that writes files declares them (``set_defaults(outputs=plan)``, where ``plan(args)``
lists :class:`Planned` files); ``npuforge.cli.main`` calls :func:`check_outputs` with them and with
every file and folder the command reads, before the command runs. A planned file is refused when

- it is one of the inputs (or an input model's weights file), or two planned files are one file;
- it is empty, a folder, under something that is not a folder, or an existing non-regular file (a
  device node, a pipe): only regular files are ever replaced;
- it exists and holds another kind of file than the command writes (a photo where a CSV goes, an
  ONNX model where an IR goes), unless ``--force``; a file the command only writes beside the one
  named (the QDQ ``.onnx`` of ``quantize -o q.nfir``) must also be npuforge's own.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import NpuforgeError

# The kinds of file npuforge writes, each recognised by its first bytes (see _kind_of).
KINDS = ("ir", "safetensors", "onnx", "tflite", "npub", "npz", "png", "text", "dir")


@dataclass(frozen=True)
class Planned:
    """A file a command will write: ``path``, its ``kind``, the ``option`` that named it (``--output``)
    and, for a file written beside the named one, what it is (``"its QDQ file"``)."""

    path: Path
    kind: str
    option: str
    beside: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown output kind {self.kind!r}")

    @property
    def label(self) -> str:
        return f"{self.option} {self.path}" if self.beside is None else f"{self.path} ({self.beside})"


def ir_set(path, option: str = "--output", qdq: bool = False) -> list[Planned]:
    """An IR at ``path`` with its weights beside it (and, for ``quantize``, its QDQ ONNX file)."""
    path = Path(path)
    if not path.name:  # '' or '.': refused by check_outputs as it is
        return [Planned(path, "ir", option)]
    if path.suffix in (".onnx", ".safetensors"):
        beside = ".safetensors and .onnx files are" if qdq else ".safetensors file is"
        raise NpuforgeError(f"{option} {path}: name the IR file (e.g. {path.with_suffix('.nfir')}); the {beside} "
                            f"written beside it")
    planned = [Planned(path, "ir", option), Planned(path.with_suffix(".safetensors"), "safetensors", option,
                                                    f"the weights of {option} {path}")]
    if qdq:
        planned.append(Planned(path.with_suffix(".onnx"), "onnx", option, f"the QDQ export of {option} {path}"))
    return planned


def _kind_of(path: Path) -> str | None:
    """The kind of an existing regular file from its first bytes; None for one npuforge never writes."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        return "empty"
    if head.startswith(b"npuforge-ir "):
        return "ir"
    if head[:4] == b"NPUB":
        return "npub"
    if head[4:8] == b"TFL3":
        return "tflite"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "npz"
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 30:
        return "safetensors"
    if head[:1] == b"\x08":  # ModelProto's first field, ir_version
        return "onnx"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:  # a character cut at the end of the block read is still text
        if e.start < len(head) - 3:
            return None
        text = head[:e.start].decode("utf-8")
    return "text" if "\x00" not in text else None


def _written_by_npuforge(path: Path, kind: str) -> bool:
    """Whether a file beside the named output is one npuforge wrote (and may replace): an ONNX file must
    name npuforge as its producer; the other kinds npuforge writes beside an output are its own formats."""
    if kind != "onnx":
        return True
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # any parse failure: not a model npuforge wrote
        return False
    return proto.producer_name == "npuforge"


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def input_files(args) -> list[Path]:
    """The files and folders a command reads, from its arguments (names every command shares)."""
    found = []
    for dest in ("model", "name", "checkpoint", "calib", "data", "val", "photos", "annotations", "class_table"):
        value = getattr(args, dest, None)
        if isinstance(value, str) and value and Path(value).exists():
            found.append(Path(value))
    images = getattr(args, "images", None)  # image files (detect, predict); detection-set's is a count
    for value in images if isinstance(images, list) else []:
        if isinstance(value, str):
            found.append(Path(value))
    for spec in getattr(args, "input", None) or []:
        if isinstance(spec, str):
            found.append(Path(spec.rpartition("=")[2]))
    for path in list(found):
        if path.is_file():
            found.extend(_weights_of(path))
    return found


def _weights_of(path: Path) -> list[Path]:
    """An IR's weights file (named on its header line, and the usual sibling)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    if not head or not head[0].startswith("npuforge-ir"):
        return []
    named = []
    for line in head[1:4]:
        if line.startswith("weights "):
            try:
                named.append(path.parent / json.JSONDecoder().raw_decode(line[len("weights "):])[0])
            except ValueError:
                pass
    return named + [path.with_suffix(".safetensors")]


def check_outputs(planned: list[Planned], inputs: list[Path], force: bool = False) -> None:
    """Refuse, in one line naming the option and the file, any planned output that would lose a file
    the user has (see the module's docstring). Nothing is written here."""
    seen = []
    for p in planned:
        text = str(p.path)
        if not text or text in (".", "..") or text.endswith(os.sep):
            raise NpuforgeError(f"{p.option} '{text}': name a file to write, not a folder")
        for other in inputs:
            if _same(p.path, other):
                what = "is" if p.beside is None else "would overwrite"
                raise NpuforgeError(f"{p.label} {what} the input {other}; write the output under another name")
        for q in seen:
            if _same(p.path, q.path):
                raise NpuforgeError(f"{p.label} and {q.label} are the same file; give them different names")
        seen.append(p)
        parent = p.path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if parent.exists() and not parent.is_dir():
            raise NpuforgeError(f"{p.label}: {parent} is not a folder")
        if not os.path.lexists(p.path):
            continue
        mode = os.stat(p.path).st_mode
        if p.kind == "dir":
            if not stat.S_ISDIR(mode):
                raise NpuforgeError(f"{p.label}: exists and is not a folder")
            continue
        if stat.S_ISDIR(mode):
            raise NpuforgeError(f"{p.label}: is a folder; name a file to write")
        if not stat.S_ISREG(mode):
            raise NpuforgeError(f"{p.label}: exists and is not a regular file (a device, pipe or socket); "
                                f"npuforge replaces only regular files")
        if force:
            continue
        kind = _kind_of(p.path)
        if kind == "empty":
            continue
        if kind != p.kind:
            found = f"a{'n' if (kind or 'x')[0] in 'aeiou' else ''} {kind} file" if kind else "a file npuforge does not write"
            raise NpuforgeError(f"{p.label}: exists and is {found}, not the {p.kind} file this writes; "
                                f"remove it, name another output, or pass --force")
        if p.beside is not None and not _written_by_npuforge(p.path, kind):
            raise NpuforgeError(f"{p.label}: exists and was not written by npuforge; remove it, name another "
                                f"output, or pass --force")


def add_force_option(parser) -> None:
    parser.add_argument("--force", action="store_true",
                        help="replace existing outputs even when they hold another kind of file (inputs, folders "
                             "and device files are never replaced)")
