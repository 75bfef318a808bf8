"""The shared ImageNet sample, preprocessed as the EfficientNet-Lite reference does:
bicubic resize of the short side to 256, center crop 224, (x - 127) / 128."""

from pathlib import Path

import numpy as np
from PIL import Image


def load_image(path: Path, size: int = 224, resize: int = 256) -> np.ndarray:
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        scale = resize / min(w, h)
        im = im.resize((max(resize, round(w * scale)), max(resize, round(h * scale))), Image.BICUBIC)
        w, h = im.size
        left, top = (w - size) // 2, (h - size) // 2
        im = im.crop((left, top, left + size, top + size))
        x = np.asarray(im, dtype=np.float32)
    return ((x - 127.0) / 128.0).transpose(2, 0, 1)


def sample_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))


def class_index(folder: Path) -> dict[str, int]:
    table = folder.parent / "imagenet_classes.tsv"
    rows = [line.split("\t") for line in table.read_text().splitlines()[1:] if line.strip()]
    return {wnid: int(idx) for idx, wnid, *_ in rows}
