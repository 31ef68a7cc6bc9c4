#!/usr/bin/env python3
"""convert_reference.py - checks a conversion tstaged made against numpy's
and ml_dtypes' astype (what jnp.astype does).

Usage: convert_reference.py IN FROM GOT TO

IN holds raw little-endian elements of dtype FROM, GOT what tstaged answered
for them converted to TO (float32, bfloat16, float16). Every element must
match astype bit for bit, except that a NaN need only be a NaN of the same
sign. Prints "ok N" and exits 0, or prints the first mismatches and exits 1.
"""
import sys

import ml_dtypes
import numpy as np

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
BITS = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16}


def main():
    src_path, src_dt, got_path, dst_dt = sys.argv[1:5]
    src = np.fromfile(src_path, dtype=DTYPES[src_dt])
    got = np.fromfile(got_path, dtype=DTYPES[dst_dt])
    if got.size != src.size:
        print(f"{got.size} elements, want {src.size}")
        return 1
    with np.errstate(over="ignore", invalid="ignore"):
        want = src.astype(DTYPES[dst_dt])
    gb, wb = got.view(BITS[dst_dt]), want.view(BITS[dst_dt])
    gf, wf = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(wf)
    bad = np.flatnonzero(np.where(nan, ~np.isnan(gf) | (np.signbit(gf) != np.signbit(wf)),
                                  gb != wb))
    for i in bad[:8]:
        print(f"[{i}] {src_dt} {src.view(BITS[src_dt])[i]:#x} -> got {gb[i]:#x}, "
              f"astype {wb[i]:#x}")
    if bad.size:
        print(f"{bad.size} of {src.size} differ")
        return 1
    print(f"ok {src.size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
