#!/usr/bin/env python3
"""The JAX host-offloading guide's configurations, run against a tstaged.

For the 10-layer MLP (d=256, h=1024, batch 256, float32, loss sum, gradients
only) under each policy - no offload, parameters offloaded, activation x
offloaded, both - this creates the model, asks :analyze for the memory
analysis, runs one :step, and prints our figures beside the guide's (XLA on
TPU). Then the 4-layer 7168x7168 MLP with Adam, analysis only (it needs
~3.3 GB of device memory to run).

    make run &                      # or: build/tstaged --sim-device-memory 8GiB
    python3 examples/offload_guide.py [--url http://127.0.0.1:8470] [--no-step]

Only the Python standard library is used.
"""
import argparse
import json
import struct
import urllib.error
import urllib.request

MiB = 1024 * 1024

GUIDE = {  # the guide's figures (XLA, TPU): argument, output, temp in MiB
    "no offload": (20.25, 20.0, 17.25),
    "params offloaded": (0.25, 20.0, None),
    "activation x offloaded": (20.25, 20.0, 6.50),
    "both": (0.25, 20.0, 4.75),
}

POLICIES = {
    "no offload": {"params": "device", "activations": {"save": ["x", "h"], "offload": []}},
    "params offloaded": {"params": "pinned_host", "activations": {"save": ["x", "h"], "offload": []}},
    "activation x offloaded": {"params": "device", "activations": {"save": [], "offload": ["x"]}},
    "both": {"params": "pinned_host", "activations": {"save": [], "offload": ["x"]}},
}


def call(url, method, path, body=None, raw=None, ctype="application/json"):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": ctype} if data is not None else {})
    try:
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode()[:300]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8470")
    ap.add_argument("--device", default=None, help="device to place the models on")
    ap.add_argument("--no-step", action="store_true", help="analysis only")
    ap.add_argument("--prefetch", type=int, default=0)
    a = ap.parse_args()

    # the batch: 256 x 256 float32, uploaded once as an uncommitted array
    batch = struct.pack("<%df" % (256 * 256), *[((i * 37) % 101) / 101.0 - 0.5 for i in range(256 * 256)])
    call(a.url, "PUT", "/v1/arrays/guide.x?dtype=float32&shape=256,256", raw=batch,
         ctype="application/octet-stream")

    print(f"{'policy':24} | {'argument MiB':>13} | {'output MiB':>10} | {'temp MiB':>9} | "
          f"{'guide arg/out/temp':>20} | {'predicted peak':>14} | {'measured peak':>13}")
    for name, pol in POLICIES.items():
        placement = dict(pol, prefetch_depth=a.prefetch)
        if a.device:
            placement["device"] = a.device
        model = "guide-" + name.replace(" ", "-")
        call(a.url, "POST", "/v1/models?wait=true", {
            "name": model, "mlp": {"layers": 10, "d_model": 256, "d_hidden": 1024,
                                   "activation": "relu"},
            "loss": "sum", "init": {"seed": 0, "scale": 0.02}, "placement": placement})
        an = call(a.url, "POST", f"/v1/models/{model}:analyze", {"batch": [256, 256]})
        measured = "-"
        if not a.no_step:
            st = call(a.url, "POST", f"/v1/models/{model}:step?wait=true",
                      {"inputs": "guide.x", "steps": 1})
            measured = f"{st['measured_peak_device_bytes'] / MiB:.2f} MiB"
        g = GUIDE[name]
        guide = "/".join("-" if v is None else f"{v:.2f}" for v in g)
        print(f"{name:24} | {an['argument_size_in_bytes'] / MiB:13.2f} | "
              f"{an['output_size_in_bytes'] / MiB:10.2f} | {an['temp_size_in_bytes'] / MiB:9.2f} | "
              f"{guide:>20} | {an['peak_device_bytes'] / MiB:10.2f} MiB | {measured:>13}")
        call(a.url, "DELETE", f"/v1/models/{model}")

    print()
    for name, state in (("7168x7168 Adam, all on device", "device"),
                        ("7168x7168 Adam, opt state on host", "pinned_host")):
        # analysed without creating it: nothing is allocated
        spec = {"mlp": {"layers": 4, "d_model": 7168, "activation": "relu"},
                "optimizer": {"type": "adam", "learning_rate": 1e-3},
                "placement": {"params": "device", "opt_state": state}}
        an = call(a.url, "POST", "/v1/models:analyze", {"model": spec, "batch": [128, 7168]})
        print(f"{name:36}: {an['peak_device_bytes'] / 1e9:.2f} GB on the device "
              f"(guide: {'4.59' if state == 'device' else '2.87'} GB)")


if __name__ == "__main__":
    main()
