"""Quantization analysis: where a quantized network loses accuracy and what fixes it.

Per-layer error (cumulative and isolated; SQNR, cosine, relative MSE), weight
statistics per output channel, a ranking of the layers by their share of the
network-output error, fixes tried on the worst layers, a mixed-precision search
for a target accuracy drop, and a self-contained HTML report. See docs/analysis.md.
"""

from .analyze import analyze

__all__ = ["analyze"]
