"""A synthetic detection set for training and tests on a CPU: shapes pasted onto photos.

Each image is a photo of a folder (resized on its short side and centre-cropped to
``size`` x ``size``) with 1 to ``max_objects`` shapes pasted on it: squares, circles,
triangles and crosses (the four categories), each in a random colour with a random
stripe texture, 10 % to 45 % of the image wide, boxes never overlapping (so no shape
hides another and every box is the tight box of what is visible). Everything is seeded
per (seed, image index): the same arguments give the same bytes, and the first N images
of a larger set are the N-image set. Written as PNG files and one COCO JSON
(``annotations.json``), the JSON last, so a set with a JSON is complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import NpuforgeError
from ..fileio import write_atomic
from ..images import read_rgb
from ..zoo.data import _is_image

SHAPES = ("square", "circle", "triangle", "cross")


def _mask(shape: str, w: int, h: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    u, v = (xx + 0.5) / w, (yy + 0.5) / h  # in (0, 1)
    if shape == "square":
        return np.ones((h, w), bool)
    if shape == "circle":
        return (u - 0.5) ** 2 + (v - 0.5) ** 2 <= 0.25
    if shape == "triangle":  # apex at the top centre, base along the bottom
        return np.abs(u - 0.5) <= v / 2
    return (np.abs(u - 0.5) <= 0.17) | (np.abs(v - 0.5) <= 0.17)  # cross


def _photo(path: Path, size: int) -> np.ndarray:
    img = read_rgb(path)  # an unreadable photo is a one-line error naming it
    scale = size / min(img.size)
    img = img.resize((max(size, round(img.width * scale)), max(size, round(img.height * scale))), Image.BILINEAR)
    left, top = (img.width - size) // 2, (img.height - size) // 2
    return np.asarray(img.crop((left, top, left + size, top + size)), np.uint8).copy()


def render(photo: np.ndarray, rng: np.random.Generator, max_objects: int) -> tuple[np.ndarray, list]:
    """The image with shapes pasted, and [(category index, x0, y0, x1, y1)] of their tight boxes."""
    img = photo.copy()
    size = img.shape[0]
    placed: list = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            k = int(rng.integers(len(SHAPES)))
            w = int(rng.integers(int(0.10 * size), int(0.45 * size) + 1))
            h = w if SHAPES[k] != "square" else int(np.clip(w * rng.uniform(0.6, 1.6), 0.1 * size, 0.45 * size))
            x0, y0 = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
            if all(x0 >= b[3] or b[1] >= x0 + w or y0 >= b[4] or b[2] >= y0 + h for b in placed):
                break
        else:
            continue
        mask = _mask(SHAPES[k], w, h)
        colour = rng.integers(0, 256, 3)
        angle, period = rng.uniform(0, np.pi), rng.uniform(3, 9)
        yy, xx = np.mgrid[0:h, 0:w]
        stripes = (np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period) > 0)[..., None]
        texture = np.where(stripes, colour, (colour * 0.55).astype(np.int64)).astype(np.uint8)
        region = img[y0:y0 + h, x0:x0 + w]
        region[mask] = texture[mask]
        ys, xs = np.nonzero(mask)
        placed.append((k, x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1))
    return img, placed


def make_synthetic_set(photos, out, images: int = 200, size: int = 160, seed: int = 0, max_objects: int = 4,
                       progress=None) -> Path:
    """Write ``images`` synthetic images and ``annotations.json`` under ``out``; returns the JSON path."""
    photos, out = Path(photos), Path(out)
    if not photos.is_dir():
        raise NpuforgeError(f"--photos {photos}: not a folder")
    sources = sorted(p for p in photos.rglob("*") if _is_image(p))
    if not sources:
        raise NpuforgeError(f"--photos {photos}: no images (.jpg, .png, ...) in it")
    if images < 1 or size < 32 or max_objects < 1:
        raise NpuforgeError("--images and --max-objects must be at least 1 and --size at least 32")
    json_path = out / "annotations.json"
    if json_path.exists():
        raise NpuforgeError(f"{json_path} exists; choose another output folder or delete it")
    (out / "images").mkdir(parents=True, exist_ok=True)
    records, annotations = [], []
    for i in range(images):
        rng = np.random.default_rng([seed, i])
        source = sources[int(rng.integers(len(sources)))]
        img, boxes = render(_photo(source, size), rng, max_objects)
        name = f"{i:06d}.png"
        Image.fromarray(img).save(out / "images" / name, format="PNG")
        records.append({"id": i + 1, "file_name": name, "width": size, "height": size, "source": source.name})
        for k, x0, y0, x1, y1 in boxes:
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": k + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
        if progress:
            progress(i + 1)
    coco = {"info": {"description": f"npuforge synthetic detection set: {images} images of {size}x{size}, "
                                    f"seed {seed}, photos from {photos.name}"},
            "images": records, "annotations": annotations,
            "categories": [{"id": k + 1, "name": s} for k, s in enumerate(SHAPES)]}
    write_atomic(json_path, (json.dumps(coco, indent=1, sort_keys=True) + "\n").encode())
    return json_path
