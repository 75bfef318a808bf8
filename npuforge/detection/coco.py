"""COCO-format detection annotations: read, check, iterate.

A set is a JSON file with ``images`` (id, file_name, width, height), ``annotations`` (id,
image_id, category_id, bbox [x, y, width, height] in pixels, area, iscrowd) and
``categories`` (id, name), beside a folder of images. Everything a training or evaluation
run would trip over later is refused when the file is read, one line naming the file and
the record: a missing or unreadable file, an image listed twice, an annotation of an
unknown image or category, a box with a non-positive size or outside its image.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import NpuforgeError

BOX_SLACK = 0.5  # pixels a box may pass the image edge (annotation tools round outwards)


@dataclass
class DetectionSet:
    path: Path  # the JSON file
    image_dir: Path
    images: list  # dicts: id, file_name, width, height
    categories: list  # dicts: id, name
    boxes: dict  # image id -> float32 [n, 4] as x0, y0, x1, y1
    labels: dict  # image id -> int64 [n] category ids
    raw: dict  # the JSON itself (pycocotools reads it)

    def __len__(self) -> int:
        return len(self.images)

    @property
    def category_names(self) -> dict[int, str]:
        return {c["id"]: c["name"] for c in self.categories}

    def image_path(self, image: dict) -> Path:
        return self.image_dir / image["file_name"]


def _need(record: dict, keys: tuple, where: str) -> None:
    if not isinstance(record, dict):
        raise NpuforgeError(f"{where}: expected an object, got {type(record).__name__}")
    missing = [k for k in keys if k not in record]
    if missing:
        raise NpuforgeError(f"{where}: missing '{missing[0]}'")


def load_coco(path, image_dir=None, check_files: bool = True) -> DetectionSet:
    """Read and check a COCO annotation file; ``image_dir`` defaults to the file's folder (or
    its ``images/`` subfolder when the file names are found there)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise NpuforgeError(f"{path}: annotation file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise NpuforgeError(f"{path}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise NpuforgeError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    _need(raw, ("images", "annotations", "categories"), str(path))
    images, categories = raw["images"], raw["categories"]
    by_id = {}
    for k, im in enumerate(images):
        where = f"{path}: images[{k}]"
        _need(im, ("id", "file_name", "width", "height"), where)
        if im["id"] in by_id:
            raise NpuforgeError(f"{where}: image id {im['id']} is listed twice")
        if not (isinstance(im["width"], int) and isinstance(im["height"], int) and im["width"] > 0
                and im["height"] > 0):
            raise NpuforgeError(f"{where}: width and height must be positive integers")
        by_id[im["id"]] = im
    cats = set()
    for k, c in enumerate(categories):
        _need(c, ("id", "name"), f"{path}: categories[{k}]")
        cats.add(c["id"])
    if image_dir is None:
        image_dir = path.parent
        if images and not (image_dir / images[0]["file_name"]).exists() and (path.parent / "images").is_dir():
            image_dir = path.parent / "images"
    image_dir = Path(image_dir)
    boxes = {i: [] for i in by_id}
    labels = {i: [] for i in by_id}
    for k, a in enumerate(raw["annotations"]):
        where = f"{path}: annotation {a.get('id', k) if isinstance(a, dict) else k}"
        _need(a, ("image_id", "category_id", "bbox"), where)
        if a["image_id"] not in by_id:
            raise NpuforgeError(f"{where}: unknown image id {a['image_id']}")
        if a["category_id"] not in cats:
            raise NpuforgeError(f"{where}: unknown category id {a['category_id']} (categories: "
                                f"{', '.join(str(c) for c in sorted(cats))})")
        im = by_id[a["image_id"]]
        bbox = a["bbox"]
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            raise NpuforgeError(f"{where}: bbox must be [x, y, width, height], got {bbox!r}")
        x, y, w, h = bbox
        if w <= 0 or h <= 0:
            raise NpuforgeError(f"{where}: box {bbox} has a non-positive width or height")
        if x < -BOX_SLACK or y < -BOX_SLACK or x + w > im["width"] + BOX_SLACK or y + h > im["height"] + BOX_SLACK:
            raise NpuforgeError(f"{where}: box {bbox} lies outside its {im['width']}x{im['height']} image "
                                f"'{im['file_name']}'")
        boxes[a["image_id"]].append([x, y, x + w, y + h])
        labels[a["image_id"]].append(a["category_id"])
    if check_files:
        for im in images:
            if not (image_dir / im["file_name"]).is_file():
                raise NpuforgeError(f"{path}: image file '{im['file_name']}' (id {im['id']}) not found in {image_dir}")
    return DetectionSet(path, image_dir, list(images), list(categories),
                        {i: np.asarray(b, np.float32).reshape(-1, 4) for i, b in boxes.items()},
                        {i: np.asarray(v, np.int64) for i, v in labels.items()}, raw)
