"""Quantization-aware training: the integer program's forward with straight-through gradients
(:mod:`npuforge.qat.program`), trained by the training command's loop (``npuforge qat``)."""

from .program import QATProgram

__all__ = ["QATProgram"]
