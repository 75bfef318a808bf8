"""A linear probe: a logistic-regression classifier on a network's frozen features.

Used two ways: as the baseline a fine-tuning run must beat (benchmarks/finetune.py), and
to start fine-tuning from (``--probe-init``: linear probing then fine-tuning, which keeps
a randomly initialised head from tearing up the pretrained features in the first steps).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .data import collate, eval_batches, rng_for

L2_CHOICES = (1e-4, 1e-3, 1e-2, 1e-1)


@torch.no_grad()
def features(model, dataset, head, batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's inputs (flattened) and the labels over a SampleSet, in eval mode."""
    grabbed = []
    hook = head.register_forward_pre_hook(lambda m, args: grabbed.append(args[0].flatten(1)))
    was_training = model.training
    model.eval()
    xs, ys = [], []
    try:
        for batch in eval_batches(len(dataset), batch_size, 1, 0):
            x, y, _ = collate([dataset[k] for k in batch])
            if len(y):
                model(x)
                xs.append(grabbed.pop())
                ys.append(y)
    finally:
        hook.remove()
        model.train(was_training)
    return torch.cat(xs), torch.cat(ys)


def fit(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float) -> torch.nn.Linear:
    """L2-regularized logistic regression by L-BFGS, started from zero: the problem is convex, but
    300 iterations do not always reach its optimum, and a random start made the result (and the
    L2 chosen) depend on the global RNG's state (the same split scored 84.0 or 83.5)."""
    head = torch.nn.Linear(x.shape[1], classes)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    opt = torch.optim.LBFGS(head.parameters(), max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(head(x), y) + l2 * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head


def probe(x: torch.Tensor, y: torch.Tensor, classes: int, seed: int = 0):
    """(head on standardized features, mean, std, chosen L2): L2 picked on a seeded fifth."""
    mean, std = x.mean(0), x.std(0) + 1e-6
    z = (x - mean) / std
    order = torch.from_numpy(rng_for(seed, 8).permutation(len(y)))
    val, rest = order[:max(1, len(y) // 5)], order[max(1, len(y) // 5):]

    def score(l2):
        return float((fit(z[rest], y[rest], classes, l2)(z[val]).argmax(1) == y[val]).float().mean())

    l2 = max(L2_CHOICES, key=score)
    return fit(z, y, classes, l2), mean, std, l2


@torch.no_grad()
def init_head(head: torch.nn.Linear, probed: torch.nn.Linear, mean: torch.Tensor, std: torch.Tensor) -> None:
    """Set ``head`` to the probe, with the standardization folded into its weights."""
    w = probed.weight / std
    head.weight.copy_(w)
    head.bias.copy_(probed.bias - w @ mean)
