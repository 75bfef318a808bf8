"""Typed quantization options. An unknown key or a misspelt value is an error."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields

from ..errors import NpuforgeError
from .observers import METHODS

GRANULARITIES = ("per-channel", "per-tensor")
ACTIVATION_DTYPES = ("uint8", "int8")
WEIGHT_METHODS = ("minmax", "mse")
TARGETS = ("", "tflite")


@dataclass
class QuantConfig:
    method: str = field(default="minmax", metadata={
        "help": f"activation range observer: {', '.join(METHODS)}"})
    granularity: str = field(default="per-channel", metadata={
        "help": "weight scales: per-channel (one per output channel) or per-tensor"})
    activation_dtype: str = field(default="uint8", metadata={"help": "uint8 or int8 activations"})
    symmetric: bool = field(default=False, metadata={
        "help": "symmetric activations (zero point 0 for int8, 128 for uint8) instead of asymmetric"})
    weight_method: str = field(default="auto", metadata={
        "help": "weight clipping: minmax, mse, or auto (minmax per channel, mse per tensor)"})
    reduce_range: bool = field(default=False, metadata={
        "help": "7-bit weights [-63, 63], as ONNX Runtime's reduce_range: its u8s8 kernels on x86 CPUs without "
                "VNNI add products in int16 pairs, which saturate with 8-bit weights"})
    percentile: float = field(default=99.99, metadata={"help": "the percentile method's percentile"})
    bins: int = field(default=4096, metadata={"help": "histogram bins of percentile, kl and mse (a power of two)"})
    int16: list = field(default_factory=list, metadata={
        "help": "names of values (tensors) or nodes whose activations are quantized to int16"})
    keep_float: list = field(default_factory=list, metadata={"help": "names of nodes kept in float"})
    concat_range_ratio: float = field(default=16.0, metadata={
        "help": "a Concat whose inputs' calibrated ranges differ more than this factor (a detector's boxes and "
                "scores, say; the narrowest input would span fewer than 256/ratio codes of the shared 8-bit grid) "
                "is quantized in int16, with a warning naming it; 0 keeps every Concat in the activation dtype"})
    norm_spread_codes: float = field(default=8.0, metadata={
        "help": "a LayerNormalization, InstanceNormalization or L2Normalize whose narrowest calibrated input slice "
                "(a ViT's class token, a BERT row beside outlier channels) has a spread of fewer than this many "
                "steps of its 8-bit grid gets an int16 input, with a warning naming it; 0 keeps 8 bits"})
    per_channel: list = field(default_factory=list, metadata={
        "help": "names of compute nodes whose weights get per-channel scales when granularity is per-tensor"})
    calibration_engine: str = field(default="ort", metadata={
        "help": "who runs the float graph during calibration: ort (ONNX Runtime, fast) or npuforge"})
    equalize: bool = field(default=False, metadata={
        "help": "cross-layer equalization of consecutive Conv/Gemm layers before calibration (for per-tensor "
                "weights)"})
    bias_correction: bool = field(default=False, metadata={
        "help": "empirical bias correction: remove each layer's mean output shift caused by quantization, "
                "measured on the calibration data"})
    adaround: bool = field(default=False, metadata={
        "help": "AdaRound: learn each weight's rounding (up or down) layer by layer on the calibration data"})
    adaround_iters: int = field(default=300, metadata={"help": "AdaRound optimisation steps per layer"})
    adaround_bias_correction: bool = field(default=True, metadata={
        "help": "correct each layer's bias right after AdaRound learns its rounding, so later layers learn on "
                "corrected inputs"})
    adaround_cache: str = field(default="", metadata={
        "help": "folder where AdaRound saves each layer's rounding as it is learnt; a rerun reuses them (resume)"})
    tflite_multipliers: bool = field(default=False, metadata={
        "help": "TFLite's integer arithmetic: multipliers normalized to [2^30, 2^31) as TFLite stores them (by "
                "default right shifts of up to 10 bits are folded in, so requantization rounds once instead of "
                "twice), and TFLite's ADD, MEAN, AVERAGE_POOL_2D, FULLY_CONNECTED, SOFTMAX and activation "
                "kernels with its fixed output grids; needed by the int8 TFLite export"})
    ort_multipliers: bool | None = field(default=None, metadata={
        "help": "move each Conv / Gemm multiplier by at most 2^-18 of itself (more where a channel's outputs stay "
                "small, never an output by more than 2^-10 of a code) to one whose fixed-point rule ONNX "
                "Runtime's integer convolution reproduces exactly, so the integer simulator runs more of the "
                "model on ONNX Runtime's int8 kernels; default (None): on, except with tflite_multipliers, "
                "whose multipliers are TFLite's exact values"})
    target: str = field(default="", metadata={
        "help": "tflite: quantize for the TFLite export, which then always takes the result: TFLite's "
                "arithmetic (tflite_multipliers), int8 activations, int16 only where LiteRT's 16x8 kernels compute "
                "npuforge's integers (norm_spread_codes 0), and the graph rewrites TFLite needs (a fused LeakyRelu "
                "split off its convolution, PRelu and LayerNormalization as builtins; docs/tflite.md)"})
    strict: bool = field(default=False, metadata={
        "help": "an op with no quantization rule is an error instead of a warning (it is kept in float)"})

    def __post_init__(self):
        _choose("method", self.method, METHODS)
        _choose("granularity", self.granularity, GRANULARITIES)
        _choose("activation_dtype", self.activation_dtype, ACTIVATION_DTYPES)
        _choose("weight_method", self.weight_method, WEIGHT_METHODS + ("auto",))
        _choose("calibration_engine", self.calibration_engine, ("ort", "npuforge"))
        _choose("target", self.target, TARGETS)
        if self.target == "tflite":
            self.tflite_multipliers = True
            self.activation_dtype = "int8"  # (a uint8 grid is the same grid shifted: nothing is lost)
            self.norm_spread_codes = 0.0  # (a normalization is decomposed into TFLite builtins)
        if not 50.0 < self.percentile <= 100.0:
            raise NpuforgeError(f"quantization option percentile={self.percentile}: give a value in (50, 100]")
        if self.bins < 256 or self.bins & (self.bins - 1):
            raise NpuforgeError(f"quantization option bins={self.bins}: give a power of two >= 256")
        if self.ort_multipliers and self.tflite_multipliers:
            raise NpuforgeError("quantization options ort_multipliers and tflite_multipliers exclude each other: "
                                "TFLite's multipliers are its exact values")
        if self.concat_range_ratio < 0 or (0 < self.concat_range_ratio < 1):
            raise NpuforgeError(f"quantization option concat_range_ratio={self.concat_range_ratio}: give 0 (off) "
                                "or a factor >= 1")
        if self.adaround_iters < 1:
            raise NpuforgeError(f"quantization option adaround_iters={self.adaround_iters}: give at least 1")
        self.int16, self.keep_float, self.per_channel = list(self.int16), list(self.keep_float), list(self.per_channel)

    @property
    def resolved_ort_multipliers(self) -> bool:
        """Whether the quantizer moves multipliers to ones ONNX Runtime reproduces: as asked, by default
        unless TFLite's own multipliers are asked for."""
        return (not self.tflite_multipliers) if self.ort_multipliers is None else self.ort_multipliers

    @property
    def resolved_weight_method(self) -> str:
        if self.weight_method != "auto":
            return self.weight_method
        return "minmax" if self.granularity == "per-channel" else "mse"

    @classmethod
    def from_dict(cls, options: dict) -> "QuantConfig":
        known = [f.name for f in fields(cls)]
        for key in options:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f"; options: {', '.join(known)}"
                raise NpuforgeError(f"unknown quantization option '{key}'{hint}")
        return cls(**options)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _choose(option: str, value, choices) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise NpuforgeError(f"quantization option {option}='{value}' is not one of {', '.join(choices)}{hint}")
