"""The tensor element types of the IR, and their numpy / torch / ONNX spellings."""

import numpy as np
import torch

from ..errors import UnsupportedError

# name -> (numpy dtype, torch dtype, ONNX TensorProto enum value)
_TABLE = {
    "float32": (np.float32, torch.float32, 1),
    "uint8": (np.uint8, torch.uint8, 2),
    "int8": (np.int8, torch.int8, 3),
    "int16": (np.int16, torch.int16, 5),
    "int32": (np.int32, torch.int32, 6),
    "int64": (np.int64, torch.int64, 7),
    "bool": (np.bool_, torch.bool, 9),
    "float16": (np.float16, torch.float16, 10),
    "float64": (np.float64, torch.float64, 11),
}
DTYPES = tuple(_TABLE)
FLOAT_DTYPES = ("float16", "float32", "float64")

_FROM_ONNX = {v[2]: k for k, v in _TABLE.items()}
_FROM_NUMPY = {np.dtype(v[0]): k for k, v in _TABLE.items()}
_FROM_TORCH = {v[1]: k for k, v in _TABLE.items()}


def check_dtype(name: str) -> str:
    if name not in _TABLE:
        raise UnsupportedError(f"unsupported dtype '{name}'; supported: {', '.join(DTYPES)}")
    return name


def to_numpy(name: str):
    return _TABLE[check_dtype(name)][0]


def to_torch(name: str) -> torch.dtype:
    return _TABLE[check_dtype(name)][1]


def to_onnx(name: str) -> int:
    return _TABLE[check_dtype(name)][2]


def from_onnx(elem_type: int, where: str = "") -> str:
    if elem_type not in _FROM_ONNX:
        import onnx

        try:
            label = onnx.TensorProto.DataType.Name(elem_type)
        except ValueError:
            label = str(elem_type)
        raise UnsupportedError(
            f"{where}: ONNX element type {label} is not supported; supported: {', '.join(DTYPES)}"
        )
    return _FROM_ONNX[elem_type]


def from_numpy(dtype) -> str:
    dt = np.dtype(dtype)
    if dt not in _FROM_NUMPY:
        raise UnsupportedError(f"numpy dtype {dt} is not supported; supported: {', '.join(DTYPES)}")
    return _FROM_NUMPY[dt]


def from_torch(dtype: torch.dtype) -> str:
    if dtype not in _FROM_TORCH:
        raise UnsupportedError(f"torch dtype {dtype} is not supported; supported: {', '.join(DTYPES)}")
    return _FROM_TORCH[dtype]
