#!/usr/bin/env python3
"""Prints the memory figures docs/API.md quotes, from a live tstaged.

The guide's table itself comes from examples/offload_guide.py (run it with
--prefetch 0 and --prefetch 1); this prints the rest, each line naming where
the docs use it:

  - the guide's MLP (10 layers, d=256, h=1024, batch 256, float32, loss sum,
    gradients only, x and h saved): the peak of a step and of an evaluation
    with params on the device and on pinned_host, prefetch 0 and 1, predicted
    by :analyze and measured by running each once;
  - the same model in bfloat16: what its rounded operands add to temp;
  - the 4-layer 7168x7168 MLP with Adam, batch 128, analysed without being
    created: argument and peak, optimizer state on the device or on
    pinned_host, without and with clip_global_norm.

    build/tstaged --port 0 --port-file /tmp/port &    # or make run
    python3 scripts/doc_figures.py --url http://127.0.0.1:$(cat /tmp/port)

Needs a device with 64 MiB free (the default sim devices have 2 GiB). Only the
Python standard library is used; the models it makes are deleted.
"""
import argparse
import json
import struct
import urllib.error
import urllib.request

MiB = 1024 * 1024


def call(url, method, path, body=None, raw=None, ctype="application/json"):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": ctype} if data is not None else {})
    try:
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode()[:300]}")


def guide_model(url, name, params, prefetch, dtype="float32"):
    call(url, "POST", "/v1/models?wait=true", {
        "name": name, "mlp": {"layers": 10, "d_model": 256, "d_hidden": 1024, "activation": "relu"},
        "loss": "sum", "dtype": dtype, "init": {"seed": 0, "scale": 0.02},
        "placement": {"params": params, "prefetch_depth": prefetch,
                      "activations": {"save": ["x", "h"], "offload": []}}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8470")
    a = ap.parse_args()
    u = a.url

    batch = struct.pack("<%df" % (256 * 256), *[((i * 37) % 101) / 101.0 - 0.5 for i in range(256 * 256)])
    call(u, "PUT", "/v1/arrays/figures.x?dtype=float32&shape=256,256", raw=batch,
         ctype="application/octet-stream")

    print("guide MLP, batch 256: peak device MiB, predicted = measured (API.md, Evaluation)")
    for params in ("device", "pinned_host"):
        for prefetch in (0, 1):
            name = f"figures-{params.replace('_', '-')}-{prefetch}"
            guide_model(u, name, params, prefetch)
            row = []
            for mode, verb in (("step", "step"), ("evaluate", "evaluate")):
                an = call(u, "POST", f"/v1/models/{name}:analyze", {"batch": [256, 256], "mode": mode})
                run = call(u, "POST", f"/v1/models/{name}:{verb}?wait=true", {"inputs": "figures.x"})
                row.append(f"{mode} {an['peak_device_bytes'] / MiB:.2f} = "
                           f"{run['measured_peak_device_bytes'] / MiB:.2f}")
            print(f"  params {params:11} prefetch {prefetch}: " + ", ".join(row))
            call(u, "DELETE", f"/v1/models/{name}")

    temps = {}
    for dtype in ("float32", "bfloat16"):
        name = f"figures-{dtype}"
        guide_model(u, name, "device", 0, dtype)
        temps[dtype] = call(u, "POST", f"/v1/models/{name}:analyze",
                            {"batch": [256, 256]})["temp_size_in_bytes"]
        call(u, "DELETE", f"/v1/models/{name}")
    print("guide MLP in bfloat16: temp %+.2f MiB over float32 (API.md, Mixed precision)"
          % ((temps["bfloat16"] - temps["float32"]) / MiB))

    print("4-layer 7168x7168 MLP, Adam, batch 128, POST /v1/models:analyze "
          "(API.md, Analysis and the guide's configurations)")
    for clip in (0.0, 1.0):
        for state in ("device", "pinned_host"):
            spec = {"mlp": {"layers": 4, "d_model": 7168},
                    "optimizer": {"type": "adam", "clip_global_norm": clip},
                    "placement": {"opt_state": state}}
            an = call(u, "POST", "/v1/models:analyze", {"model": spec, "batch": [128, 7168]})
            print(f"  opt_state {state:11} clip {'yes' if clip else 'no '}: "
                  f"argument_size_in_bytes {an['argument_size_in_bytes']}, "
                  f"peak_device_bytes {an['peak_device_bytes']} "
                  f"({an['peak_device_bytes'] / 1e9:.2f} GB)")
    call(u, "DELETE", "/v1/arrays/figures.x")


if __name__ == "__main__":
    main()
