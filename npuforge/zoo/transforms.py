"""Image preprocessing with Pillow and NumPy (no torchvision).

``eval_transform(config)`` returns a callable PIL image -> float32 CHW array:
resize the short side to ``config.resize_size`` (the same integer rounding as
torchvision's ``Resize(int)``), center-crop ``config.crop_size`` (torchvision's
rounding), then ``(pixel - mean) / std`` with pixels in 0..255.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from ..images import MAX_PIXELS

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


def preprocess_problem(pre) -> str | None:
    """What is wrong with a preprocessing record (the JSON object a graph's metadata, a training run
    and a program's META carry; see npuforge/workflow.py transform_of), or None: a record read from a
    file is checked before an image is resized to it."""
    if not isinstance(pre, dict):
        return f"'preprocess' is a JSON {type(pre).__name__}, not an object"
    fit = pre.get("fit")
    if fit not in (None, "letterbox", "resize"):
        return f"'preprocess' fit {fit!r}; expected 'letterbox', 'resize' or none"
    crop = pre.get("crop_size")
    if not (_sizes(crop, 2) and crop[0] * crop[1] <= MAX_PIXELS):
        return f"'preprocess' crop_size {crop!r}; two sizes of at least 1 expected, at most {MAX_PIXELS} pixels"
    if fit == "letterbox" and crop[0] != crop[1]:
        return f"'preprocess' crop_size {crop!r}; a letterbox is square"
    if fit is None and not (_sizes([pre.get("resize_size")], 1) and pre["resize_size"] <= 8 * max(crop)):
        return f"'preprocess' resize_size {pre.get('resize_size')!r}; a size 1..{8 * max(crop)} expected"
    if pre.get("interpolation") not in _RESAMPLE:
        return f"'preprocess' interpolation {pre.get('interpolation')!r}; one of {', '.join(_RESAMPLE)}"
    for name in ("mean", "std"):
        v = pre.get(name)
        if not (isinstance(v, list) and len(v) == 3 and all(_finite(x) for x in v)) or (name == "std" and 0 in v):
            return f"'preprocess' {name} {v!r}; three finite numbers expected" + (" (none 0)" if name == "std" else "")
    if pre.get("layout", "nchw") not in LAYOUTS:
        return f"'preprocess' layout {pre.get('layout')!r}; one of {', '.join(LAYOUTS)}"
    return None


LAYOUTS = ("nchw", "nhwc")  # the model's input layout ([N, 3, H, W] or [N, H, W, 3])


class ChannelsLast:
    """A CHW transform's output as HWC, for a model whose input is [N, H, W, 3]."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, img: Image.Image) -> np.ndarray:
        return np.ascontiguousarray(self.transform(img).transpose(1, 2, 0))

    def __repr__(self) -> str:
        return f"ChannelsLast({self.transform!r})"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _sizes(v, n: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                                       for x in v)


def resize_short_side(img: Image.Image, size: int, interpolation: str = "bilinear") -> Image.Image:
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    if short == size:
        return img
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    return img.resize((new_w, new_h), _RESAMPLE[interpolation])


def center_crop(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    th, tw = size
    w, h = img.size
    if tw > w or th > h:  # pad like torchvision: zeros around the image
        canvas = Image.new(img.mode, (max(w, tw), max(h, th)))
        canvas.paste(img, ((max(w, tw) - w) // 2, (max(h, th) - h) // 2))
        img, (w, h) = canvas, canvas.size
    top = int(round((h - th) / 2.0))
    left = int(round((w - tw) / 2.0))
    return img.crop((left, top, left + tw, top + th))


def normalize(arr: np.ndarray, mean, std) -> np.ndarray:
    """HWC uint8 -> CHW float32 ``(x - mean) / std``."""
    x = arr.astype(np.float32)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


class EvalTransform:
    def __init__(self, resize_size: int, crop_size: tuple[int, int], interpolation: str, mean, std):
        self.resize_size = resize_size
        self.crop_size = tuple(crop_size)
        self.interpolation = interpolation
        self.mean = tuple(mean)
        self.std = tuple(std)

    def __call__(self, img: Image.Image) -> np.ndarray:
        img = img.convert("RGB")
        img = center_crop(resize_short_side(img, self.resize_size, self.interpolation), self.crop_size)
        return normalize(np.asarray(img), self.mean, self.std)

    def __repr__(self) -> str:
        return (f"EvalTransform(resize {self.resize_size} {self.interpolation}, crop {self.crop_size}, "
                f"mean {self.mean}, std {self.std})")


def letterbox(img: Image.Image, size: int, interpolation: str = "bilinear") -> tuple[Image.Image, float, int, int]:
    """The image fitted into a ``size`` x ``size`` square, aspect ratio kept, centred on black:
    (square, scale, left pad, top pad), as detectors such as MediaPipe's are fed."""
    scale = size / max(img.size)
    w, h = max(1, round(img.width * scale)), max(1, round(img.height * scale))
    canvas = Image.new("RGB", (size, size))
    left, top = (size - w) // 2, (size - h) // 2
    canvas.paste(img.convert("RGB").resize((w, h), _RESAMPLE[interpolation]), (left, top))
    return canvas, scale, left, top


class LetterboxTransform:
    """PIL image -> float32 CHW: :func:`letterbox` into the square input, then ``(x - mean) / std``
    (a preprocessing record with ``"fit": "letterbox"``)."""

    def __init__(self, size: int, interpolation: str, mean, std):
        self.size, self.interpolation, self.mean, self.std = size, interpolation, tuple(mean), tuple(std)

    def __call__(self, img: Image.Image) -> np.ndarray:
        return normalize(np.asarray(letterbox(img, self.size, self.interpolation)[0]), self.mean, self.std)

    def __repr__(self) -> str:
        return f"LetterboxTransform({self.size} {self.interpolation}, mean {self.mean}, std {self.std})"


class ResizeTransform:
    """PIL image -> float32 CHW: a plain resize to (height, width), aspect ratio not kept, then
    ``(x - mean) / std`` (a preprocessing record with ``"fit": "resize"``: the zoo detectors train
    on images resized so, their boxes scaled with them)."""

    def __init__(self, size: tuple[int, int], interpolation: str, mean, std):
        self.size, self.interpolation, self.mean, self.std = tuple(size), interpolation, tuple(mean), tuple(std)

    def __call__(self, img: Image.Image) -> np.ndarray:
        h, w = self.size
        return normalize(np.asarray(img.resize((w, h), _RESAMPLE[self.interpolation])), self.mean, self.std)

    def __repr__(self) -> str:
        return f"ResizeTransform({self.size[0]}x{self.size[1]} {self.interpolation}, mean {self.mean}, std {self.std})"


def eval_transform(config, image_size: int | tuple[int, int] | None = None) -> EvalTransform:
    """The evaluation preprocessing of a :class:`PretrainedConfig` (optionally at another crop size)."""
    crop = config.crop_size
    resize = config.resize_size
    if image_size is not None:
        crop = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        resize = int(max(crop) / config.crop_pct)
    return EvalTransform(resize, crop, config.interpolation, config.mean, config.std)
