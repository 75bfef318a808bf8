"""Element-type rules of the shape rules: ONNX's type constraints, within the
dtypes the IR has (npuforge.ir.dtypes: no uint16/32/64, bfloat16 or string)."""

from ..ir.dtypes import FLOAT_DTYPES
from .registry import fail

FLOAT = FLOAT_DTYPES
SIGNED = ("int8", "int16", "int32", "int64")
INTEGER = ("uint8",) + SIGNED
NUMERIC = INTEGER + FLOAT
ANY = NUMERIC + ("bool",)
INDEX = ("int32", "int64")
# The reductions' T (uint32/uint64 aside): int32 and int64 are the only integers.
REDUCIBLE = INDEX + FLOAT


def require_dtype(node, info, allowed, what: str = "input") -> None:
    """Fail, naming the node, when ``info``'s dtype is not one ONNX allows here."""
    if info.dtype not in allowed:
        fail(node, f"{what} dtype {info.dtype} is not allowed here (one of {', '.join(allowed)})")
