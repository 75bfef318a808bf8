"""Evaluation and prediction loops for zoo models (PyTorch, float)."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import NpuforgeError
from .data import ImageDataset, iter_batches
from .transforms import eval_transform


@dataclass
class EvalResult:
    model: str
    data: str
    images: int  # images evaluated (corrupt ones not counted)
    top1: float  # percent
    top5: float  # percent
    skipped: int  # corrupt / unreadable images left out
    seconds: float
    images_per_s: float
    skipped_files: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", file=sys.stderr, disable=not enabled, leave=False)


def evaluate_logits(forward, dataset: ImageDataset, transform, *, batch_size: int = 32, workers: int = 2,
                    progress: bool = True, name: str = "model", dist=None) -> EvalResult:
    """Top-1 / top-5 accuracy (percent) of ``forward`` (float32 NCHW batch -> [N, classes]
    logits, any engine) over ``dataset``; corrupt images are skipped and counted.

    ``dist`` (:class:`~npuforge.distributed.Distributed`, under torchrun): ``dataset`` is this
    process's share; the counts are summed over the processes (exact integers), so every process
    returns the result of the whole set."""
    correct1 = correct5 = seen = 0
    start = time.perf_counter()
    bar = _progress(len(dataset), f"eval {name}", progress)
    try:
        done = 0
        for x, y, _ in iter_batches(dataset, transform, batch_size, workers):
            logits = np.asarray(forward(x))
            if logits.ndim != 2:
                raise NpuforgeError(f"{name}: expected [N, classes] logits, got shape {list(logits.shape)}")
            if int(y.max()) >= logits.shape[1]:
                raise NpuforgeError(f"{name}: the dataset has label {int(y.max())} but the model has "
                                    f"{logits.shape[1]} classes; pass a matching --class-table or num_classes")
            k = min(5, logits.shape[1])
            top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
            correct1 += int((top[:, 0] == y).sum())
            correct5 += int((top == y[:, None]).any(axis=1).sum())
            seen += len(y)
            total_now = seen + len(dataset.skipped)
            bar.update(total_now - done)
            done = total_now
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    skipped = [f"{p}: {why}" for p, why in dataset.skipped]
    total = len(dataset)
    if dist is not None and dist.active:
        shares = dist.gather((correct1, correct5, seen, total, skipped, seconds))
        correct1, correct5, seen, total = (sum(share[k] for share in shares) for k in range(4))
        skipped = [line for share in shares for line in share[4]]
        seconds = max(share[5] for share in shares)
    if seen == 0:
        raise NpuforgeError(f"{dataset.root}: none of the {total} images could be read "
                            f"({len(skipped)} corrupt); check the files")
    return EvalResult(model=name, data=str(dataset.root), images=seen, top1=100.0 * correct1 / seen,
                      top5=100.0 * correct5 / seen, skipped=len(skipped), seconds=seconds,
                      images_per_s=seen / seconds if seconds > 0 else float("inf"), skipped_files=skipped)


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: ImageDataset, transform=None, *, batch_size: int = 32,
             workers: int = 2, progress: bool = True, name: str | None = None,
             channels_last: bool = True) -> EvalResult:
    """Top-1 / top-5 accuracy (percent) of a torch ``model`` over ``dataset``.

    ``channels_last``: run the model in NHWC memory layout (about 1.6x faster on CPU
    for depthwise convolutions; the model's layout is restored afterwards).
    """
    config = getattr(model, "zoo_config", None)
    if transform is None:
        if config is None:
            raise NpuforgeError("evaluate: the model has no zoo config; pass transform=")
        transform = eval_transform(config)
    name = name or getattr(model, "zoo_name", type(model).__name__)
    was_training = model.training
    model.eval()
    if channels_last:
        model.to(memory_format=torch.channels_last)

    def forward(x: np.ndarray) -> np.ndarray:
        batch = torch.from_numpy(x)
        return model(batch.contiguous(memory_format=torch.channels_last) if channels_last else batch).numpy()

    try:
        return evaluate_logits(forward, dataset, transform, batch_size=batch_size, workers=workers,
                               progress=progress, name=name)
    finally:
        model.train(was_training)
        if channels_last:
            model.to(memory_format=torch.contiguous_format)


@torch.no_grad()
def predict(model: torch.nn.Module, images, k: int = 5, transform=None, class_names=None) -> list[dict]:
    """Top-``k`` (class index, name, probability) for each image path."""
    from ..images import read_rgb

    config = getattr(model, "zoo_config", None)
    transform = transform or eval_transform(config)
    names = class_names or (config.class_names if config is not None else None)
    arrays = []
    for path in images:
        path = Path(path)
        if not path.is_file():
            raise NpuforgeError(f"{path}: no such image file")
        arrays.append(transform(read_rgb(path)))
    was_training = model.training
    model.eval()
    try:
        probs = torch.softmax(model(torch.from_numpy(np.stack(arrays))), dim=1)
    finally:
        model.train(was_training)
    k = min(k, probs.shape[1])
    values, indices = probs.topk(k, dim=1)
    results = []
    for path, vals, idxs in zip(images, values.tolist(), indices.tolist()):
        results.append({"image": str(path), "top": [
            {"index": i, "name": names[i] if names is not None and i < len(names) else str(i), "probability": p}
            for i, p in zip(idxs, vals)]})
    return results
