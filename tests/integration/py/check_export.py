#!/usr/bin/env python3
"""check_export.py - reads files tstaged served (.npy downloads, safetensors
exports) with the reference readers, numpy's np.load and
safetensors.numpy.load_file, and compares them with what they must hold.

Usage: check_export.py SPEC.json

SPEC is {"checks": [CHECK, ...]}; each CHECK is one of
  {"kind": "npy", "file": F, "dtype": D, "shape": [...], "raw": R}
      np.load(F) must have dtype D (tstage's name; bfloat16 is numpy's
      2-byte void), shape, and C-order little-endian bytes equal to file R.
  {"kind": "safetensors", "file": F, "tensors": [{"name", "dtype",
   "shape", "raw"}], "metadata": {...} or null, "reference": REF,
   "prefix": P}
      load_file(F) must hold exactly the tensors listed (dtype, shape,
      bytes); __metadata__ must equal metadata when that key is present;
      with "reference", every tensor of the reference file REF (written by
      the safetensors package) must be in F as P + its name with identical
      dtype, shape and bytes.
Prints one line per check ("ok ..." or "FAIL ...") and exits 0 only when
every check passed, 1 when one failed, 2 when the spec is unusable.
"""
import json
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def c_bytes(a):
    a = np.asarray(a)
    if a.dtype.kind != "V" and a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a).tobytes(order="C")


def dtype_ok(a, name):
    if name == "bfloat16":
        return a.dtype.kind == "V" and a.dtype.itemsize == 2
    return a.dtype == np.dtype(name)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def check_array(what, a, dtype, shape, data):
    if not dtype_ok(a, dtype):
        return "%s: dtype %s, want %s" % (what, a.dtype, dtype)
    if list(a.shape) != list(shape):
        return "%s: shape %s, want %s" % (what, list(a.shape), list(shape))
    got = c_bytes(a)
    if got != data:
        first = next((i for i in range(min(len(got), len(data))) if got[i] != data[i]),
                     min(len(got), len(data)))
        return "%s: %d bytes differ from the %d expected (first at byte %d)" % (
            what, len(got), len(data), first)
    return None


def check_npy(c):
    a = np.load(c["file"], allow_pickle=False)
    return check_array(c["file"], a, c["dtype"], c["shape"], read(c["raw"]))


def check_safetensors(c):
    got = load_file(c["file"])
    want = {t["name"]: t for t in c.get("tensors", [])}
    if "tensors" in c and sorted(got) != sorted(want):
        return "%s: tensors %s, want %s" % (c["file"], sorted(got), sorted(want))
    for name, t in want.items():
        why = check_array("%s[%s]" % (c["file"], name), got[name], t["dtype"], t["shape"],
                          read(t["raw"]))
        if why:
            return why
    if "metadata" in c:
        with safe_open(c["file"], framework="numpy") as f:
            meta = f.metadata()
        if (meta or None) != (c["metadata"] or None):
            return "%s: __metadata__ %s, want %s" % (c["file"], meta, c["metadata"])
    if c.get("reference"):
        ref = load_file(c["reference"])
        prefix = c.get("prefix", "")
        for name, a in ref.items():
            mine = got.get(prefix + name)
            if mine is None:
                return "%s: tensor %s%s of %s is missing" % (c["file"], prefix, name,
                                                             c["reference"])
            if mine.dtype != a.dtype or mine.shape != a.shape or c_bytes(mine) != c_bytes(a):
                return "%s[%s%s]: differs from the reference %s (%s%s vs %s%s)" % (
                    c["file"], prefix, name, c["reference"], mine.dtype, list(mine.shape),
                    a.dtype, list(a.shape))
    return None


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: check_export.py SPEC.json\n")
        return 2
    try:
        checks = json.loads(read(sys.argv[1]))["checks"]
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write("check_export: bad spec %s: %s\n" % (sys.argv[1], e))
        return 2
    failed = 0
    for c in checks:
        try:
            if c["kind"] == "npy":
                why = check_npy(c)
            elif c["kind"] == "safetensors":
                why = check_safetensors(c)
            else:
                why = "unknown kind %r" % c["kind"]
        except Exception as e:  # a reader refusing the file is a failure to report
            why = "%s: %s: %s" % (c.get("file"), type(e).__name__, e)
        if why:
            failed += 1
            print("FAIL " + why)
        else:
            print("ok %s %s" % (c["kind"], c["file"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
