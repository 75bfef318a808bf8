"""Post-training quantization: observers, schemes, alignment, LUTs, requantization.

    import npuforge
    qgraph = npuforge.quantize("model.onnx", calibration_batches, {"method": "kl"})
"""

from .config import QuantConfig
from .params import QParams
from .quantize import quantize

__all__ = ["QuantConfig", "QParams", "quantize"]
