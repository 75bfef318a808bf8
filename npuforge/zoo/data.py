"""Image datasets for evaluation and calibration.

Two layouts, detected from the folder:

* ImageFolder: one subfolder per class (``root/<class>/<image>``). Classes are the
  sorted subfolder names, unless a class table is given, or every subfolder name
  is an ImageNet wnid: then labels are the table's indices.
* flat ImageNet style: ``root/<wnid>_<anything>.<ext>``; labels come from a class
  table TSV (columns ``index``, ``wnid``, ``name``), by default the built-in
  ImageNet-1k table.

Files are listed in sorted order. Images are decoded lazily; one that Pillow
cannot read is skipped and recorded in ``dataset.skipped`` (path, reason).
"""

from __future__ import annotations

import csv
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from ..images import ImageReadError, read_rgb

from ..errors import NpuforgeError

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm"}


@dataclass(frozen=True)
class ClassTable:
    wnids: tuple[str, ...]
    names: tuple[str, ...]
    source: str = ""

    def __len__(self) -> int:
        return len(self.wnids)

    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.wnids)}


def read_class_table(path) -> ClassTable:
    """Read a class table TSV with a header ``index<TAB>wnid<TAB>name``; indices must be 0..N-1 in order."""
    path = Path(path)
    if not path.is_file():
        raise NpuforgeError(f"{path}: no such class table file (--class-table)")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read(1 << 24)  # 16 MiB: far beyond any class table
    except UnicodeDecodeError:
        raise NpuforgeError(f"{path}: not a text file; --class-table takes a TSV (index, wnid, name)") from None
    return _parse_table(text.splitlines(), str(path))


def _parse_table(lines: list[str], where: str) -> ClassTable:
    rows = list(csv.reader(lines, delimiter="\t"))
    if not rows or [c.strip().lower() for c in rows[0][:3]] != ["index", "wnid", "name"]:
        raise NpuforgeError(f"{where}: a class table needs a header line 'index<TAB>wnid<TAB>name'")
    wnids, names = [], []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 3:
            raise NpuforgeError(f"{where}:{lineno}: expected 3 tab-separated columns (index, wnid, name), got {len(row)}")
        try:
            idx = int(row[0])
        except ValueError:
            raise NpuforgeError(f"{where}:{lineno}: index '{row[0]}' is not an integer") from None
        if idx != len(wnids):
            raise NpuforgeError(f"{where}:{lineno}: index {idx} out of order; expected {len(wnids)}")
        if row[1] in wnids:
            raise NpuforgeError(f"{where}:{lineno}: wnid '{row[1]}' appears twice")
        wnids.append(row[1])
        names.append(row[2])
    if not wnids:
        raise NpuforgeError(f"{where}: the class table has no rows")
    return ClassTable(tuple(wnids), tuple(names), where)


@lru_cache(maxsize=1)
def imagenet_class_table() -> ClassTable:
    """The built-in ImageNet-1k class table (sorted wnids = standard class order)."""
    text = resources.files("npuforge.zoo").joinpath("imagenet_classes.tsv").read_text(encoding="utf-8")
    return _parse_table(text.splitlines(), "built-in imagenet_classes.tsv")


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")


class ImageDataset:
    """A labelled list of image files; ``dataset[i]`` -> (PIL image or None, label, path)."""

    def __init__(self, root, class_table=None, limit: int | None = None, skip: int = 0, labelled: bool = True,
                 option: str = "--data"):
        """``labelled=False`` (calibration): any file names, label -1 for a flat folder. ``option``:
        the command-line option that named ``root``, for the messages."""
        self.root = Path(root)
        if not self.root.is_dir():
            raise NpuforgeError(f"{self.root}: no such folder ({option})")
        table = read_class_table(class_table) if isinstance(class_table, (str, Path)) else class_table
        entries = sorted(self.root.iterdir())
        files = [p for p in entries if _is_image(p)]
        dirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
        class_dirs = [d for d in dirs if any(_is_image(p) for p in d.iterdir())]
        if files and class_dirs:
            raise NpuforgeError(f"{self.root}: holds both images and class subfolders; use one layout "
                                f"(flat <wnid>_name.JPEG files, or one subfolder per class)")
        self.samples: list[tuple[Path, int]] = []
        if class_dirs:
            self.layout = "imagefolder"
            names = [d.name for d in class_dirs]
            if not labelled:
                table = None
            elif table is None and all(n in imagenet_class_table().index() for n in names):
                table = imagenet_class_table()
            if table is not None:
                index = table.index()
                unknown = [n for n in names if n not in index]
                if unknown:
                    raise NpuforgeError(f"{self.root}: class folder(s) {unknown[:5]} not in the class table "
                                        f"{table.source}; fix the names or pass another --class-table")
                self.classes = list(table.names)
                self.class_table = table
                labels = {n: index[n] for n in names}
            else:
                self.classes = names
                self.class_table = None
                labels = {n: i for i, n in enumerate(names)}
            for d in class_dirs:
                self.samples += [(p, labels[d.name]) for p in sorted(d.iterdir()) if _is_image(p)]
        elif files and not labelled:
            self.layout, self.classes, self.class_table = "flat", [], None
            self.samples = [(p, -1) for p in files]
        elif files:
            self.layout = "flat"
            table = table or imagenet_class_table()
            index = table.index()
            self.classes = list(table.names)
            self.class_table = table
            for p in files:
                wnid = p.name.split("_", 1)[0]
                if wnid not in index:
                    raise NpuforgeError(f"{p}: file name does not start with a wnid of the class table "
                                        f"({table.source}); name files <wnid>_<name>.JPEG or use class subfolders")
                self.samples.append((p, index[wnid]))
        else:
            raise NpuforgeError(f"{self.root}: no images found (extensions {', '.join(sorted(IMAGE_EXTENSIONS))}); "
                                f"point {option} at a folder of images or of class subfolders")
        if skip:
            if skip < 0 or skip >= len(self.samples):
                raise NpuforgeError(f"--skip {skip}: {self.root} holds {len(self.samples)} images; "
                                    f"skip fewer than that")
            self.samples = self.samples[skip:]
        if limit is not None:
            if limit < 1:
                raise NpuforgeError(f"--limit {limit}: give a positive number of images")
            self.samples = self.samples[:limit]
        self.skipped: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def keep_first(self, n: int) -> None:
        """Keep ``n`` images for calibration: the first in file order for a flat folder; for class
        subfolders, one image of each class in turn (each class's files in order), so every class
        is represented rather than the first folder alone."""
        if self.layout == "imagefolder":
            by_class: dict[int, list] = {}
            for sample in self.samples:
                by_class.setdefault(sample[1], []).append(sample)
            queues = list(by_class.values())
            order = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
            self.samples = order[:n]
        else:
            self.samples = self.samples[:n]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        try:
            img = read_rgb(path)
        except ImageReadError as e:
            with self._lock:
                self.skipped.append((str(path), str(e).removeprefix(f"{path}: ")))
            return None, label, path
        return img, label, path

    def __repr__(self) -> str:
        return f"ImageDataset({self.root}, {self.layout}, {len(self)} images, {len(self.classes)} classes)"


def iter_batches(dataset: ImageDataset, transform: Callable, batch_size: int = 32, workers: int = 2
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, list[Path]]]:
    """Yield (images float32 NCHW, labels int64 N, paths) in dataset order; corrupt images are left out.

    The last batch may be smaller; a batch whose images were all corrupt is not yielded.
    """
    if batch_size < 1:
        raise NpuforgeError(f"--batch-size {batch_size}: give a positive batch size")

    def load(i):
        img, label, path = dataset[i]
        return (None if img is None else transform(img)), label, path

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for start in range(0, len(dataset), batch_size):
            items = [r for r in pool.map(load, range(start, min(start + batch_size, len(dataset)))) if r[0] is not None]
            if not items:
                continue
            x = np.stack([r[0] for r in items])
            y = np.asarray([r[1] for r in items], dtype=np.int64)
            yield x, y, [r[2] for r in items]
