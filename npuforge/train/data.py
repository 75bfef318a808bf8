"""Training data: a picklable dataset of (path, label) samples, Pillow/NumPy train
transforms, a seeded validation split, and the batch plan each process follows.

Every random choice is a pure function of ``(seed, epoch, index)``: the epoch's order
of samples, each sample's crop and flip, each step's mixup / cutmix. Which worker
decodes an image, or whether the run was stopped and resumed, cannot change a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..images import ImageReadError, read_rgb

from ..errors import NpuforgeError
from ..zoo.transforms import _RESAMPLE, normalize


def rng_for(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, *[int(k) for k in keys]])


class TrainTransform:
    """Random resized crop (area 8-100 %, aspect 3/4-4/3, as torchvision's), horizontal
    flip, ``(pixel - mean) / std``; picklable, randomness from the caller's generator."""

    def __init__(self, size: tuple[int, int], mean, std, interpolation: str = "bilinear",
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip: float = 0.5):
        self.size, self.mean, self.std = tuple(size), tuple(mean), tuple(std)
        self.interpolation, self.scale, self.ratio, self.hflip = interpolation, scale, ratio, hflip

    def crop_box(self, w: int, h: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        area = w * h
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
                return left, top, left + cw, top + ch
        ratio = w / h  # fall back to a centre crop at the closest allowed aspect
        cw, ch = (w, int(round(w / self.ratio[0]))) if ratio < self.ratio[0] else \
            ((int(round(h * self.ratio[1])), h) if ratio > self.ratio[1] else (w, h))
        cw, ch = min(cw, w), min(ch, h)
        left, top = (w - cw) // 2, (h - ch) // 2
        return left, top, left + cw, top + ch

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        img = img.convert("RGB")
        box = self.crop_box(*img.size, rng)
        img = img.resize((self.size[1], self.size[0]), _RESAMPLE[self.interpolation], box=box)
        arr = np.asarray(img)
        if rng.uniform() < self.hflip:
            arr = arr[:, ::-1]
        return normalize(np.ascontiguousarray(arr), self.mean, self.std)


def open_rgb(path):
    """The image at ``path`` as RGB, or None when it cannot be read (the loaders skip and count it)."""
    try:
        return read_rgb(path)
    except ImageReadError:
        return None


class SampleSet(torch.utils.data.Dataset):
    """``dataset[(epoch, i)]`` -> (CHW float32 or None for an unreadable image, label, i).

    Holds only paths, labels and the transform, so it pickles into spawned workers."""

    def __init__(self, samples: list, transform, seed: int, train: bool):
        self.samples, self.transform, self.seed, self.train = list(samples), transform, seed, train

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key):
        epoch, i = key
        path, label = self.samples[i]
        img = open_rgb(path)
        if img is None:
            return None, label, i
        x = self.transform(img, rng_for(self.seed, 1, epoch, i)) if self.train else self.transform(img)
        return x, label, i


def collate(items):
    """Drop unreadable images (counted by the caller from the indices that are missing)."""
    good = [it for it in items if it[0] is not None]
    xs = torch.from_numpy(np.stack([it[0] for it in good])) if good else torch.zeros(0)
    return xs, torch.tensor([it[1] for it in good], dtype=torch.int64), len(items) - len(good)


def split_samples(samples: list, fraction: float, seed: int) -> tuple[list, list]:
    """A seeded split per class: each class keeps about ``fraction`` of its images for
    validation, at least one when it has two or more. A class of one image cannot be split;
    when such classes leave the validation part short of ``fraction`` of all the images
    (a folder of ImageNet-style samples, one photo per class, would keep none), a seeded draw
    of those single images makes up the shortfall: their classes are then not trained on."""
    if not 0 < fraction < 1:
        raise NpuforgeError(f"--val-split {fraction}: give a fraction between 0 and 1 (e.g. 0.2)")
    by_class: dict[int, list] = {}
    for k, s in enumerate(samples):
        by_class.setdefault(s[1], []).append(k)
    held = []
    for label in sorted(by_class):
        items = by_class[label]
        if len(items) > 1:
            order = rng_for(seed, 2, label).permutation(len(items))
            held += [items[j] for j in order[:max(int(round(len(items) * fraction)), 1)]]
    singles = [items[0] for label, items in sorted(by_class.items()) if len(items) == 1]
    short = max(min(len(singles), int(round(len(samples) * fraction)) - len(held)), 0)
    held = set(held) | {singles[j] for j in rng_for(seed, 3).permutation(len(singles))[:short]}
    in_class_order = [k for label in sorted(by_class) for k in by_class[label]]
    return ([samples[k] for k in in_class_order if k not in held],
            [samples[k] for k in in_class_order if k in held])


@dataclass
class BatchPlan:
    """Which samples each process takes at each step of an epoch (training: a seeded
    permutation, the remainder beyond whole global batches dropped so every process
    takes the same number of steps)."""

    num_samples: int
    batch_size: int  # per process
    world: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // (self.batch_size * self.world)

    def batches(self, epoch: int, rank: int, start_step: int = 0):
        order = rng_for(self.seed, 0, epoch).permutation(self.num_samples)
        gb = self.batch_size * self.world
        for step in range(start_step, self.steps_per_epoch):
            lo = step * gb + rank * self.batch_size
            yield [(epoch, int(i)) for i in order[lo:lo + self.batch_size]]


def eval_batches(num_samples: int, batch_size: int, world: int, rank: int):
    """Every sample exactly once over all processes (indices rank, rank + world, ...): no
    padding, no duplicates, so 1, 2 and 3 processes count the same images."""
    mine = list(range(rank, num_samples, world))
    for lo in range(0, len(mine), batch_size):
        yield [(0, i) for i in mine[lo:lo + batch_size]]
