"""Export the IR: plain ONNX (float) and ONNX QDQ (quantized)."""

from .onnx_export import to_onnx, to_qdq_onnx

__all__ = ["to_onnx", "to_qdq_onnx"]
