"""Checkpoint reading and strict state-dict loading with key-by-key reports.

Accepted layouts: a raw state dict, ``{"state_dict": ...}``, ``{"model": ...}``,
``{"model_state_dict": ...}``; keys may carry a ``module.`` prefix (DataParallel /
DistributedDataParallel). Files are read with ``torch.load(weights_only=True)``
(or as .safetensors); a mismatch is never loaded silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import NpuforgeError

_WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")


class CheckpointMismatchError(NpuforgeError):
    """A checkpoint whose keys or shapes disagree with the model; lists each key."""

    def __init__(self, where: str, missing, unexpected, mismatched):
        self.where = where
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = list(mismatched)  # (key, checkpoint shape, model shape)
        parts = []

        def show(items, fmt):
            shown = [fmt(x) for x in items[:12]]
            more = f" ... and {len(items) - 12} more" if len(items) > 12 else ""
            return ", ".join(shown) + more

        if self.missing:
            parts.append(f"{len(self.missing)} missing key(s): {show(self.missing, str)}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected key(s): {show(self.unexpected, str)}")
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} shape mismatch(es): "
                         + show(self.mismatched, lambda m: f"{m[0]} checkpoint {list(m[1])} vs model {list(m[2])}"))
        super().__init__(f"{where} does not match the model: " + "; ".join(parts)
                         + " (is it a checkpoint of this model and class count?)")


def read_checkpoint(path, *, weights_only: bool = True) -> dict:
    """Read a checkpoint file into a flat ``{key: tensor}`` state dict (unwrapped, no ``module.``)."""
    path = Path(path)
    if not path.is_file():
        raise NpuforgeError(f"{path}: no such checkpoint file")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file

            obj = load_file(str(path))
        except Exception as e:  # safetensors raises its own error types
            raise NpuforgeError(f"{path}: cannot read as safetensors ({type(e).__name__}: {e})") from None
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=weights_only)
        except Exception as e:  # pickle and zip errors come in many types
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            hint = (" (it holds more than tensors; re-save it as a plain state dict, or pass weights_only=False "
                    "if you trust the file)") if weights_only and "weights_only" in str(e).lower() else ""
            raise NpuforgeError(f"{path}: cannot read as a PyTorch checkpoint: {msg[:200]}{hint}") from None
    return unwrap_state_dict(obj, where=str(path))


def unwrap_state_dict(obj, where: str = "checkpoint") -> dict:
    """Find the state dict inside common wrappers and strip ``module.`` prefixes."""
    for _ in range(3):
        if isinstance(obj, Mapping) and not _looks_like_state_dict(obj):
            for key in _WRAPPER_KEYS:
                if key in obj and isinstance(obj[key], Mapping):
                    obj = obj[key]
                    break
            else:
                break
    if not isinstance(obj, Mapping) or not obj:
        raise NpuforgeError(f"{where}: no state dict found (expected a dict of tensors, or one under "
                            f"'state_dict' or 'model')")
    if not _looks_like_state_dict(obj):
        bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)][:5]
        raise NpuforgeError(f"{where}: not a state dict: entries {bad} are not tensors")
    state = dict(obj)
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def _looks_like_state_dict(obj: Mapping) -> bool:
    return bool(obj) and all(isinstance(k, str) for k in obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def load_state_dict_strict(model: torch.nn.Module, state: Mapping, where: str = "checkpoint") -> None:
    """Load ``state`` into ``model``; raise :class:`CheckpointMismatchError` on any difference."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [(k, tuple(state[k].shape), tuple(own[k].shape)) for k in own
                  if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(where, missing, unexpected, mismatched)
    model.load_state_dict(state, strict=True)


def load_checkpoint(model: torch.nn.Module, checkpoint, *, weights_only: bool = True) -> torch.nn.Module:
    """Load a checkpoint (path or dict) into ``model`` strictly; returns the model."""
    if isinstance(checkpoint, (str, Path)):
        where = str(checkpoint)
        state = read_checkpoint(checkpoint, weights_only=weights_only)
    else:
        where = "checkpoint"
        state = unwrap_state_dict(checkpoint, where)
    load_state_dict_strict(model, state, where)
    return model
