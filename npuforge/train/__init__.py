"""Training: the one loop (``npuforge zoo train``), its data, checkpoints and processes."""

from .loop import TrainConfig, train

__all__ = ["TrainConfig", "train"]
