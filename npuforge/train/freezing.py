"""What of a pretrained network fine-tuning leaves as it is: BatchNorm statistics, and the
early layers when only the last ones should learn (a few hundred images fit a whole network
too closely; the top layers alone adapt the features with far fewer free parameters)."""

from __future__ import annotations

import torch

from ..errors import NpuforgeError

_NORMS = torch.nn.modules.batchnorm._BatchNorm
_WEIGHT_LAYERS = (torch.nn.modules.conv._ConvNd, torch.nn.Linear)


def freeze_batchnorm(model) -> int:
    """BatchNorm layers to eval mode inside a training model: they normalize with their
    running statistics and stop updating them (small-data fine-tuning, and QAT once the
    statistics are folded); their affine parameters still train. Returns how many."""
    layers = [m for m in model.modules() if isinstance(m, _NORMS)]
    for m in layers:
        m.eval()
    return len(layers)


def train_last_layers(model, k: int, what: str) -> tuple[list, int, int]:
    """Only the last ``k`` weight layers (convolutions and linear layers, in the order the
    model defines its modules, which is the order the zoo's networks run them) and the
    layers with parameters that come after each of them (their normalizations) keep
    learning; every earlier parameter stops. Returns (the frozen part's BatchNorm layers,
    which must stay in eval mode so their statistics do not drift under frozen weights;
    the number of trainable parameters; the number of weight layers)."""
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    n_weight = sum(isinstance(m, _WEIGHT_LAYERS) for m in owners)
    if not 1 <= k <= n_weight:
        raise NpuforgeError(f"--trainable-layers {k}: {what} has {n_weight} convolution and linear layers; "
                            f"give 1 to {n_weight} (or leave it out to train them all)")
    first = n_weight - k  # index of the first weight layer that trains
    seen, frozen_norms, trainable = 0, [], 0
    for m in owners:
        if isinstance(m, _WEIGHT_LAYERS):
            seen += 1
        learns = seen > first
        for p in m.parameters(recurse=False):
            p.requires_grad_(learns)
            trainable += p.numel() if learns else 0
        if not learns and isinstance(m, _NORMS):
            frozen_norms.append(m)
    return frozen_norms, trainable, n_weight
