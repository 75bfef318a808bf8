"""npuforge: take a trained network to an int8 program for an NPU, and explain the cost."""

from pathlib import Path

from .errors import CheckError, NpuforgeError
from .frontend.onnx_importer import import_onnx
from .frontend.torch_frontend import export_onnx, from_torch
from .ir.graph import Graph, Node, Value
from .ir.textio import MAGIC

__version__ = "0.1.0"
__all__ = ["Graph", "Node", "Value", "NpuforgeError", "load", "save", "from_torch", "export_onnx", "import_onnx",
           "quantize", "QuantConfig"]


def quantize(model, data, config=None, **options):
    """Post-training int8 quantization; see :func:`npuforge.quant.quantize.quantize`."""
    from .quant import quantize as _quantize

    return _quantize(model, data, config, **options)


def __getattr__(name):
    if name == "QuantConfig":
        from .quant import QuantConfig

        return QuantConfig
    raise AttributeError(name)


def fixed_input_value(input_shapes: dict | None) -> str | None:
    """The first input an ``input_shapes`` dict fixes to a value (``--input-value``: a NumPy array), if any."""
    import numpy as np

    return next((name for name, v in (input_shapes or {}).items() if isinstance(v, (np.ndarray, np.generic))),
                None)


def refuse_input_values(path, input_shapes: dict | None, what: str) -> None:
    """``--input-value`` on a model that is not ONNX (``what``: a saved IR, a TFLite model): one line."""
    name = fixed_input_value(input_shapes)
    if name is not None:
        raise NpuforgeError(f"{path}: --input-value {name or '(no NAME=)'}: {what}, not an ONNX file; --input-value is "
                            f"for ONNX models only")


def refuse_input_shapes_for_ir(path, input_shapes: dict | None) -> None:
    refuse_input_values(path, input_shapes, "a saved IR")
    if input_shapes:
        raise NpuforgeError(f"{path}: a saved IR has static input shapes already; --input-shape is for ONNX files")


def load(path, input_shapes: dict | None = None) -> Graph:
    """Load an ONNX file, a TFLite flatbuffer (``.tflite``: see
    :func:`npuforge.frontend.tflite_importer.import_tflite`, NCHW with LiteRT's 4-D NHWC
    tensors transposed) or a saved npuforge IR (text graph + weights) as a checked Graph.

    ``input_shapes`` fixes an ONNX model's dynamic input sizes, e.g.
    ``{"images": (1, 3, 640, 640)}`` (a string keeps a dim symbolic). An entry whose value
    is a NumPy array fixes that input's value instead (``--input-value``), e.g.
    ``{"sr": np.array(16000)}``: the input becomes a constant of its own dtype and shape, no
    longer a graph input, so the If / Loop nodes that depend on it fold at import (ONNX only).
    """
    from .ir import textio

    path = Path(path)
    if not path.is_file():
        raise NpuforgeError(f"{path}: {'not a regular file' if path.exists() else 'no such file'}")
    with open(path, "rb") as f:
        head = f.read(max(len(MAGIC), 8))
    if head[:len(MAGIC)] == MAGIC.encode():
        refuse_input_shapes_for_ir(path, input_shapes)
        graph = textio.load(path)
        try:
            graph.check()
        except CheckError as e:  # named by the file: a saved IR edited by hand, or from another version
            raise CheckError([f"{path}: {p}" for p in e.problems]) from None
        return graph
    if head[4:8] == b"TFL3" or path.suffix.lower() == ".tflite":
        refuse_input_values(path, input_shapes, "a TFLite model")
        if input_shapes:
            raise NpuforgeError(f"{path}: TFLite models have static shapes; --input-shape is for ONNX files")
        from .frontend.tflite_importer import import_tflite

        return import_tflite(path)
    return import_onnx(path, input_shapes=input_shapes)


def save(graph: Graph, path) -> None:
    """Write ``graph`` as text at ``path`` plus its weights at ``path`` with suffix .safetensors."""
    from .ir import textio

    textio.save(graph, path)
