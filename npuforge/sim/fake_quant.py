"""The fake-quant executor: float kernels, with every quantized value rounded to
its grid (quantize -> dequantize, round half to even, saturating) as it is
produced, and every quantized constant (weights, int32 bias) likewise."""

from __future__ import annotations

import torch

from .float_exec import execute


def run_fake_quant(graph, feeds: dict, outputs: list[str] | None = None) -> dict:
    quantized = {name: v.quant for name, v in graph.values.items() if v.quant is not None and not v.is_const}

    def value_hook(name: str, t: torch.Tensor) -> torch.Tensor:
        p = quantized.get(name)
        return p.fake_quant(t) if p is not None else t

    def const_hook(value, t: torch.Tensor) -> torch.Tensor:
        if value.quant is None:
            return t
        return torch.from_numpy(value.quant.dequantize(value.quant.quantize(value.data)))

    return execute(graph, feeds, outputs, value_hook=value_hook, const_hook=const_hook)


def is_quantized(graph) -> bool:
    return any(v.quant is not None for v in graph.values.values())
