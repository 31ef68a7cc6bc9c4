#!/usr/bin/env python3
"""make_fixtures.py - reference files for it_arrays, written by numpy and by
the reference safetensors package, so that tstaged's codecs are tested
against what the real writers produce rather than against themselves.

Usage: make_fixtures.py DIR

Writes into DIR (which must exist):
  npy/<case>.npy         one file per case, written by numpy (np.save,
                         np.lib.format.write_array, or numpy's own header
                         writer for the '<V2' bfloat16 case)
  npy/<case>.raw         the bytes tstaged must hold for it: C order,
                         little-endian, exactly as the array reads
  st/<file>.safetensors  written by safetensors.numpy.save_file
  st/<file>.<tensor>.raw each tensor's bytes, as above
  manifest.json          {"npy": [{"case", "file", "raw", "dtype", "shape",
                         "hint"}], "safetensors": [{"file", "metadata",
                         "tensors": [{"name", "dtype", "shape", "raw"}]}]}

dtype names are tstage's (bool, int8, ..., bfloat16, float64). Everything
is deterministic and small (well under 1 MiB in all). Exit status 0 on
success; anything else is a broken environment (numpy or safetensors
missing: run scripts/deps.sh).
"""
import json
import os
import sys

import numpy as np
import safetensors.numpy as stnp

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
          "int64", "uint64", "float16", "float32", "float64"]


def values(dtype, shape, salt=0):
    """Deterministic values of dtype and shape that exercise every byte:
    extremes for integers, inf/nan/-0.0/subnormals for floats."""
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    dt = np.dtype(dtype)
    k = np.arange(n, dtype=np.int64) + salt
    if dt.kind == "b":
        flat = (k * 7 + 3) % 3 == 0
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        span = int(info.max) - int(info.min) + 1
        flat = np.array([(int(info.min) + (i * 2654435761 + 12345) % span) for i in k.tolist()],
                        dtype=object).astype(dt)
        if n >= 2:
            flat[0] = info.min
            flat[-1] = info.max
    else:
        flat = ((k.astype(np.float64) - n / 2) * 1.37).astype(dt)
        specials = [np.inf, -np.inf, np.nan, -0.0, np.finfo(dt).tiny / 2, np.finfo(dt).max]
        for i, v in enumerate(specials):
            if i < n:
                flat[(i * 5 + 1) % n] = v
    return np.asarray(flat, dtype=dt).reshape(shape)


def c_bytes(a):
    """What tstaged stores for a: C order, little-endian."""
    a = np.asarray(a)
    if a.dtype.kind != "V" and a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a).tobytes(order="C")


def tstage_dtype(a):
    if a.dtype.kind == "V":
        return "bfloat16"
    return np.dtype(a.dtype.newbyteorder("=")).name


class Writer:
    def __init__(self, root):
        self.root = root
        self.npy = []
        self.st = []
        os.makedirs(os.path.join(root, "npy"), exist_ok=True)
        os.makedirs(os.path.join(root, "st"), exist_ok=True)

    def _raw(self, rel, data):
        with open(os.path.join(self.root, rel), "wb") as f:
            f.write(data)

    def add_npy(self, case, a, how="save", hint=None):
        rel = "npy/%s.npy" % case
        path = os.path.join(self.root, rel)
        if how == "save":
            np.save(path, a, allow_pickle=False)
        elif how == "v2":
            with open(path, "wb") as f:
                np.lib.format.write_array(f, a, version=(2, 0), allow_pickle=False)
        elif how == "le_void":
            # numpy's own header writer, told the descr '<V2' (what a
            # bfloat16 writer that goes through numpy's void type emits)
            with open(path, "wb") as f:
                np.lib.format.write_array_header_1_0(
                    f, {"descr": "<V2", "fortran_order": False, "shape": a.shape})
                f.write(np.ascontiguousarray(a).tobytes())
        else:
            raise ValueError(how)
        back = np.load(path, allow_pickle=False)
        assert back.shape == a.shape and c_bytes(back) == c_bytes(a), case
        self._raw("npy/%s.raw" % case, c_bytes(a))
        self.npy.append({"case": case, "file": rel, "raw": "npy/%s.raw" % case,
                         "dtype": tstage_dtype(a), "shape": list(a.shape), "hint": hint})

    def add_safetensors(self, stem, tensors, metadata=None):
        rel = "st/%s.safetensors" % stem
        stnp.save_file(tensors, os.path.join(self.root, rel), metadata=metadata)
        back = stnp.load_file(os.path.join(self.root, rel))
        entries = []
        for name in sorted(tensors):
            a = tensors[name]
            assert c_bytes(back[name]) == c_bytes(a), (stem, name)
            raw = "st/%s.%s.raw" % (stem, name)
            self._raw(raw, c_bytes(a))
            entries.append({"name": name, "dtype": tstage_dtype(a), "shape": list(a.shape),
                            "raw": raw})
        self.st.append({"file": rel, "metadata": metadata, "tensors": entries})

    def finish(self):
        with open(os.path.join(self.root, "manifest.json"), "w") as f:
            json.dump({"npy": self.npy, "safetensors": self.st}, f, indent=1)


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.stderr.write("usage: make_fixtures.py DIR (an existing folder)\n")
        return 2
    w = Writer(sys.argv[1])

    for i, dt in enumerate(DTYPES):
        w.add_npy("dt_" + dt, values(dt, (3, 5), salt=i))
    w.add_npy("scalar_f64", values("float64", (), salt=3))
    w.add_npy("scalar_i32", np.array(-123456, dtype=np.int32))
    w.add_npy("empty_0x5", np.zeros((0, 5), dtype=np.float32))
    w.add_npy("rank4_u8", values("uint8", (2, 3, 4, 5)))
    w.add_npy("fortran_i32", np.asfortranarray(values("int32", (3, 4, 5))))
    w.add_npy("fortran_f64", np.asfortranarray(values("float64", (4, 3))))
    w.add_npy("fortran_u8", np.asfortranarray(values("uint8", (5, 7))))
    for dt in ["int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64"]:
        w.add_npy("be_" + dt, values(dt, (2, 3), salt=7).astype(np.dtype(dt).newbyteorder(">")))
    w.add_npy("be_fortran_f32",
              np.asfortranarray(values("float32", (3, 4)).astype(np.dtype(">f4"))))
    w.add_npy("v2_int16", values("int16", (4, 4)), how="v2")
    w.add_npy("v2_be_f64", values("float64", (3,)).astype(">f8"), how="v2")
    bf = np.frombuffer(values("uint16", (2, 6), salt=5).tobytes(), dtype="V2").reshape(2, 6)
    w.add_npy("bf16_void", bf, hint="bfloat16")                 # descr '|V2'
    w.add_npy("bf16_le_void", bf, how="le_void", hint="bfloat16")

    model = {
        "embed.weight": values("float32", (16, 8)),
        "layer0.bias": values("float16", (8,)),
        "layer0.counts": values("int64", (3, 2)),
        "mask": values("bool", (5,)),
        "ids": values("uint8", (7,)),
        "scale": values("float64", ()),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "u16": values("uint16", (2, 3)),
        "i16": values("int16", (3,)),
        "u32": values("uint32", (2, 2)),
        "u64": values("uint64", (2,)),
        "i8": values("int8", (4, 2)),
    }
    w.add_safetensors("model", model, metadata={"format": "np", "origin": "tstage-it"})
    w.add_safetensors("small", {"a": values("float32", (4,)), "b": values("int32", (2, 2))})
    w.add_safetensors("clash", {"fresh": values("float32", (3,)), "taken": values("int8", (2,))})
    w.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
