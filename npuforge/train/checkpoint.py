"""Training checkpoints: everything a run needs to continue bit for bit, and everything
the rest of npuforge needs to use the model (zoo name, class names, preprocessing).

``last.pt`` after every epoch (and on an interruption, mid-epoch), ``best.pt`` for the
best validation top-1 (a detector's: COCO mAP), and the top-k epochs as ``epoch_NNN.pt``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from ..errors import NpuforgeError

FORMAT = "npuforge-train-1"


def save(state: dict, path: Path) -> None:
    """Write beside the target and rename: a kill mid-write leaves the previous file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save({"format": FORMAT, **state}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors, numbers, strings, containers
    except Exception as e:  # a truncated or foreign file
        raise NpuforgeError(f"{path}: not a readable checkpoint ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise NpuforgeError(f"{path}: not an npuforge training checkpoint")
    return state


def read_run(path) -> dict | None:
    """A training run's checkpoint, read once; None for any other path (a zoo name, an ONNX
    file, a plain state dict)."""
    path = Path(path)
    if path.suffix != ".pt" or not path.is_file():
        return None
    try:
        state = load(path)
    except NpuforgeError:
        return None
    return state if state.get("format") == FORMAT else None


def load_run(path) -> dict:
    state = read_run(path)
    if state is None:
        raise NpuforgeError(f"{path}: not an npuforge training checkpoint (npuforge zoo train writes them)")
    return state


def model_from(state: dict, *, ema: bool = True):
    """(model in eval mode, class names, preprocess dict) of a run checkpoint's state; the
    EMA weights when the run kept them and ``ema``."""
    from ..zoo import create_model

    model = create_model(state["model_name"], pretrained=False, num_classes=len(state["classes"]),
                         **state.get("model_kwargs", {}))
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    model.load_state_dict(weights, strict=True)
    return model.eval(), list(state["classes"]), dict(state["preprocess"])


def class_table_of(state: dict, source: str = ""):
    """The run's classes as a ClassTable (ids: wnids for ImageNet-style data, else the names),
    so an evaluation folder's labels follow the training's."""
    from ..zoo.data import ClassTable

    names = tuple(state["classes"])
    return ClassTable(tuple(state.get("class_ids") or names), names, source=str(source))


def keep_top_k(run_dir: Path, ranking: list, k: int) -> list:
    """``ranking``: [(metric, epoch)] best first; delete the epoch files beyond the first k."""
    for _, epoch in ranking[k:]:
        (run_dir / f"epoch_{epoch:03d}.pt").unlink(missing_ok=True)
    return ranking[:k]
