#!/usr/bin/env python3
"""check_trace.py TRACE ANALYSIS DEVICE LAYERS WEIGHT_BYTES - checks a GET /v1/trace answer
recorded while an MLP of LAYERS layers, its weights on pinned_host (WEIGHT_BYTES each of w1[l],
w2[l]) and prefetch_depth 0, took one step on DEVICE; ANALYSIS is the model's :analyze
answer for the step's batch.

First the trace is loaded by Perfetto's trace processor (the `perfetto` package), which must
import it without an error in its stats and find every slice the JSON holds. The package
starts a trace_processor_shell binary that it downloads on first use; where it cannot (no
network, as in CI), or where TRACE_PROCESSOR_SHELL names none, the trace is checked by the
Trace Event Format's documented rules instead (what Perfetto's JSON importer relies on):
the JSON Object Format with a traceEvents list; each event's phase known and its fields of
the types that phase needs; complete events with a duration of at least 0; on one thread,
complete events nest (one inside the other or apart, never overlapping: a slice stack);
metadata events name processes and threads; counters carry numbers; each flow id has one
start and one end, of the same category and name, the start not after the end, each bound
to a slice on its thread that encloses it (the end with "bp": "e").

Then the step, on DEVICE's step tracks in time order: the copies are each layer's two
weights in (H2D of WEIGHT_BYTES) forward, the loss's value out (D2H), each layer's two
weights in again backward from the last; the kernels are gemm, act_fwd, gemm for each layer
forward, each GEMM starting once the weights it reads are in (the first, once the first
copy of the layer ended; the second, once both did), then one loss (read out after it), then
backward an act_bwd for each layer, starting once a weight of that layer is in again (the
gradient through w2), and two GEMMs or more per layer (those that read no weight may run
while the weights are copied). The bytes copied in and out are what :analyze planned (h2d_bytes,
d2h_bytes; the loss's value read out is not in the plan's)."""
import json
import os
import sys

PHASES = {"B", "E", "X", "i", "I", "C", "M", "s", "t", "f", "b", "n", "e", "P", "N", "O", "D",
          "R", "c", "(", ")"}
META = {"process_name", "thread_name", "process_sort_index", "thread_sort_index",
        "process_labels"}
# a ts and a dur are microseconds with three decimals at most: allow a nanosecond of slack
EPS = 0.0015


def fail(msg):
    sys.exit(f"trace: {msg}")


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_rules(trace):
    """The Trace Event Format's rules; answers the number of events checked."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        fail("not the JSON Object Format (an object with a traceEvents list)")
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        fail(f"displayTimeUnit {trace['displayTimeUnit']!r} is not ms or ns")
    evs = trace["traceEvents"]
    by_thread, flows = {}, {}
    for n, e in enumerate(evs):
        where = f"event {n} ({e.get('ph')!r} {e.get('name')!r})"
        if not isinstance(e, dict) or e.get("ph") not in PHASES:
            fail(f"{where}: no known phase")
        ph = e["ph"]
        if not isinstance(e.get("name"), str):
            fail(f"{where}: no name")
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid", 0), int):
            fail(f"{where}: pid and tid must be integers")
        if ph == "M":
            if e["name"] not in META:
                fail(f"{where}: metadata of an unknown kind")
            if e["name"].endswith("_name") and not isinstance(e.get("args", {}).get("name"), str):
                fail(f"{where}: a name without args.name")
            continue
        if not is_num(e.get("ts")) or e["ts"] < 0:
            fail(f"{where}: ts {e.get('ts')!r} is not a time from the trace's start")
        if "args" in e and not isinstance(e["args"], dict):
            fail(f"{where}: args is not an object")
        if ph == "X":
            if not is_num(e.get("dur")) or e["dur"] < 0:
                fail(f"{where}: a complete event needs a duration of at least 0")
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
        elif ph == "C":
            if not e.get("args") or not all(is_num(v) for v in e["args"].values()):
                fail(f"{where}: a counter's args must be numbers")
        elif ph in "stf":
            if "id" not in e:
                fail(f"{where}: a flow event without an id")
            flows.setdefault(e["id"], []).append(e)
    # on one thread complete events form a stack: each inside the enclosing one or after it
    for (pid, tid), xs in by_thread.items():
        xs.sort(key=lambda x: (x["ts"], -x["dur"]))
        stack = []
        for x in xs:
            while stack and x["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPS:
                stack.pop()
            if stack and x["ts"] + x["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + EPS:
                fail(f"pid {pid} tid {tid}: {x['name']!r} at {x['ts']} overlaps "
                     f"{stack[-1]['name']!r} at {stack[-1]['ts']} without nesting in it")
            stack.append(x)

    def enclosing(e):
        return any(x["ts"] - EPS <= e["ts"] <= x["ts"] + x["dur"] + EPS
                   for x in by_thread.get((e["pid"], e["tid"]), []))

    for fid, fs in flows.items():
        starts = [f for f in fs if f["ph"] == "s"]
        ends = [f for f in fs if f["ph"] == "f"]
        if len(starts) != 1 or len(ends) != 1:
            fail(f"flow {fid}: {len(starts)} starts and {len(ends)} ends, want one of each")
        s, f = starts[0], ends[0]
        if (s.get("cat"), s["name"]) != (f.get("cat"), f["name"]):
            fail(f"flow {fid}: its start and end differ in category or name")
        if s["ts"] > f["ts"] + EPS:
            fail(f"flow {fid}: ends at {f['ts']}, before its start at {s['ts']}")
        if f.get("bp") != "e":
            fail(f"flow {fid}: its end does not bind to the enclosing slice (bp e)")
        for e in (s, f):
            if not enclosing(e):
                fail(f"flow {fid}: its {e['ph']} at {e['ts']} is inside no slice of its thread")
    return len(evs)


def perfetto_load(path, trace):
    """Loads the trace in Perfetto's trace processor: None when its shell cannot be started
    (the reason printed), else the number of slices it found, checked against the JSON."""
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError as e:
        print(f"trace: no perfetto package ({e})")
        return None
    try:
        cfg = TraceProcessorConfig(bin_path=os.environ.get("TRACE_PROCESSOR_SHELL") or None,
                                   load_timeout=30)
        tp = TraceProcessor(trace=path, config=cfg)
    except Exception as e:   # the shell is fetched from the network on first use
        why = str(e).splitlines()[-1] if str(e) else type(e).__name__
        print(f"trace: Perfetto's trace processor did not start ({why})")
        return None
    try:
        errors = [(r.name, r.value) for r in
                  tp.query("select name, value from stats where severity in ('error', 'data_loss')"
                           " and value > 0")]
        if errors:
            fail(f"Perfetto's import reports {errors}")
        names = {}
        for r in tp.query("select name, count(*) as n from slice group by name"):
            names[r.name] = r.n
        want = {}
        for e in trace["traceEvents"]:
            if e["ph"] == "X":
                want[e["name"]] = want.get(e["name"], 0) + 1
        if names != want:
            fail(f"Perfetto found slices {names}, the JSON has {want}")
        return sum(names.values())
    finally:
        tp.close()


def step_events(trace, device):
    """DEVICE's copies and kernels on its step tracks, in time order."""
    evs = trace["traceEvents"]
    pid = next((e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"
                and e["args"]["name"] == device), None)
    if pid is None:
        fail(f"no process named {device}")
    step_tids = {e["tid"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"
                 and e["pid"] == pid and e["args"]["name"].startswith("step ")}
    out = [e for e in evs if e["ph"] == "X" and e["pid"] == pid and e["tid"] in step_tids
           and e.get("cat") in ("copy", "compute") and e["name"] != "host work"]
    out.sort(key=lambda e: e["ts"])
    return out


def label(e):
    return f"{e['name']}({e['args']['bytes']})" if e.get("cat") == "copy" else e["name"]


def check_step(evs, analysis, layers, wbytes):
    shown = " ".join(label(e) for e in evs)
    copies = [e for e in evs if e["cat"] == "copy"]
    kernels = [e for e in evs if e["cat"] == "compute"]
    weights = [f"H2D({wbytes})"] * 2

    def end(es):
        return max(e["ts"] + e["dur"] for e in es)

    def first_end(es):
        return min(e["ts"] + e["dur"] for e in es)

    # the copies: each layer's weights forward, the loss out, each layer's weights backward
    got = [label(e) for e in copies]
    want = weights * layers + ["D2H"] + weights * layers
    if [g.split("(")[0] if w == "D2H" else g for g, w in zip(got, want)] != want or \
            len(got) != len(want):
        fail(f"the step's copies are {got}, want {want} (the step: {shown})")
    fwd_w = [copies[2 * l:2 * l + 2] for l in range(layers)]
    readout = copies[2 * layers]
    bwd_w = [copies[2 * layers + 1 + 2 * i:2 * layers + 3 + 2 * i] for i in range(layers)]
    # forward: each layer's gemm, act_fwd, gemm once its weights are in; then the loss,
    # read out once computed
    losses = [k for k in kernels if k["name"] == "loss"]
    if len(losses) != 1:
        fail(f"{len(losses)} loss kernels, want one (the step: {shown})")
    loss = losses[0]
    fwd = [k for k in kernels if k["ts"] < loss["ts"]]
    if [k["name"] for k in fwd] != ["gemm", "act_fwd", "gemm"] * layers:
        fail(f"forward kernels {[k['name'] for k in fwd]}, want gemm, act_fwd, gemm for each "
             f"of {layers} layers (the step: {shown})")
    for l in range(layers):
        # its first GEMM reads the weight copied first, its second both
        for g, by in ((fwd[3 * l], first_end(fwd_w[l])), (fwd[3 * l + 2], end(fwd_w[l]))):
            if g["ts"] + EPS < by:
                fail(f"forward layer {l}: a gemm at {g['ts']} starts before the weight it "
                     f"reads is in ({by})")
    if readout["ts"] + EPS < loss["ts"] + loss["dur"]:
        fail("the loss is read out before it is computed")
    # backward, from the last layer: each layer's act_bwd (it needs the layer's weights)
    # once its weights are in again, with two GEMMs or more each
    bwd = [k for k in kernels if k["ts"] > loss["ts"]]
    acts = [k for k in bwd if k["name"] == "act_bwd"]
    if len(acts) != layers or sum(k["name"] == "gemm" for k in bwd) < 2 * layers:
        fail(f"backward kernels {[k['name'] for k in bwd]}, want act_bwd and two GEMMs or "
             f"more for each of {layers} layers (the step: {shown})")
    for i, (a, w) in enumerate(zip(acts, bwd_w)):
        if a["ts"] + EPS < first_end(w):
            fail(f"backward layer {layers - 1 - i}'s act_bwd at {a['ts']} starts before a "
                 f"weight of the layer is in again ({first_end(w)})")
    h2d = sum(e["args"]["bytes"] for e in copies if e["name"] == "H2D")
    d2h = sum(e["args"]["bytes"] for e in copies if e["name"] == "D2H") - \
        readout["args"]["bytes"]
    if (h2d, d2h) != (analysis["h2d_bytes"], analysis["d2h_bytes"]):
        fail(f"the step copied {h2d} bytes in and {d2h} out (besides the loss's "
             f"{readout['args']['bytes']}); :analyze planned {analysis['h2d_bytes']} and "
             f"{analysis['d2h_bytes']}")
    return len(evs), h2d, d2h, readout["args"]["bytes"]


def main():
    path, analysis, device, layers, wbytes = sys.argv[1:6]
    trace = json.load(open(path))
    n = perfetto_load(path, trace)
    if n is not None:
        print(f"trace: Perfetto's trace processor loaded it: {n} slices, no import error")
    else:
        n = check_rules(trace)
        print(f"trace: {n} events follow the Trace Event Format's rules "
              "(checked here, as Perfetto's trace processor could not run)")
    evs = step_events(trace, device)
    count, h2d, d2h, readout = check_step(evs, json.load(open(analysis)), int(layers), int(wbytes))
    print(f"trace: the step's {count} copies and kernels on {device} in order: "
          f"{int(layers)} layers forward, the loss, {int(layers)} backward; "
          f"{h2d} bytes in, {d2h} out besides the loss's {readout}, as :analyze planned")


if __name__ == "__main__":
    main()
