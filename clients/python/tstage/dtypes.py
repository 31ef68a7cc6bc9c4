"""The dtypes tstaged knows, as numpy dtypes (bfloat16 through ml_dtypes).

tstaged's raw bytes are little-endian, C order.
"""
from __future__ import annotations

from typing import Dict

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "to_numpy", "from_numpy"]

#: tstage dtype name -> numpy dtype (little-endian)
DTYPES: Dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype("<i1"),
    "uint8": np.dtype("<u1"),
    "int16": np.dtype("<i2"),
    "uint16": np.dtype("<u2"),
    "int32": np.dtype("<i4"),
    "uint32": np.dtype("<u4"),
    "int64": np.dtype("<i8"),
    "uint64": np.dtype("<u8"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
}


def to_numpy(name: str) -> np.dtype:
    """The numpy dtype of a tstage dtype name; ValueError for an unknown one."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype '{name}' is not one tstage knows "
                         f"({', '.join(DTYPES)})") from None


def from_numpy(dtype: np.dtype) -> str:
    """The tstage name of a numpy dtype (either byte order); ValueError for others."""
    dt = np.dtype(dtype)
    if dt == DTYPES["bfloat16"]:
        return "bfloat16"
    le = dt.newbyteorder("<") if dt.byteorder == ">" else dt
    for name, known in DTYPES.items():
        if le == known and name != "bfloat16":
            return name
    raise ValueError(f"numpy dtype '{dt}' has no tstage dtype ({', '.join(DTYPES)})")
