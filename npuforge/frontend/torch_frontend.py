"""PyTorch module -> npuforge IR, through torch.onnx.export."""

from __future__ import annotations

import io
import warnings

import onnx
import torch

from ..errors import NpuforgeError
from .onnx_importer import import_onnx


def export_onnx(module: torch.nn.Module, example_input, path_or_buffer, *, input_names=("input",),
                output_names=("output",), dynamic_batch: bool = True, opset: int = 17,
                exporter: str = "torchscript") -> None:
    """Export ``module`` in eval mode; the batch axis is dynamic unless told otherwise.

    ``exporter``: "torchscript" (fast, the classic exporter) or "dynamo"
    (torch.export based, slower to run, often a cleaner graph).
    """
    if exporter not in ("torchscript", "dynamo"):
        raise NpuforgeError(f"exporter '{exporter}' is not one of torchscript, dynamo")
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    was_training = module.training
    module.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                dyn = tuple({0: torch.export.Dim("N")} for _ in args) if dynamic_batch else None
                torch.onnx.export(module, args, path_or_buffer, dynamo=True, input_names=list(input_names),
                                  output_names=list(output_names), opset_version=max(opset, 18),
                                  dynamic_shapes=dyn, verbose=False)
            else:
                axes = {n: {0: "N"} for n in (*input_names, *output_names)} if dynamic_batch else None
                torch.onnx.export(module, args, path_or_buffer, dynamo=False, input_names=list(input_names),
                                  output_names=list(output_names), opset_version=opset, dynamic_axes=axes,
                                  do_constant_folding=True)
    finally:
        module.train(was_training)


def from_torch(module: torch.nn.Module, example_input, **export_options):
    """Import a torch module by exporting it to ONNX first (see :func:`export_onnx`)."""
    buffer = io.BytesIO()
    export_onnx(module, example_input, buffer, **export_options)
    model = onnx.load_from_string(buffer.getvalue())
    return import_onnx(model, name=type(module).__name__)
