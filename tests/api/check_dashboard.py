#!/usr/bin/env python3
"""check_dashboard.py MEM0 DOM0 MEM1 DOM1 ARRAY SPACE NBYTES [OP TOTAL] - checks the
dashboard's DOM (as Chromium dumped it) against /v1/memory read at the same
moment: one bar per space with its used, peak and limit; after the upload of
ARRAY (NBYTES on SPACE, "device/memory_kind"), the array's row with that
placement and the space's bytes in use grown by NBYTES, and operation OP in
flight with TOTAL units to do.
check_dashboard.py --spaces MEM DOM checks the spaces of one page only.
check_dashboard.py --history HIST DOM POOL SPACE NBYTES MODEL OP checks the history drawn
after ARRAY was deleted against /v1/memory/history read then (HIST): POOL's chart has a
line for SPACE whose largest value is NBYTES above its last (the spike, drawn higher than
the rest), its last as HIST says, and the pool's limit (drawn or named); MODEL's loss
curve is operation OP's, and OP is on the timeline, cancelled.
check_dashboard.py --fleet MEM DOM NODE NODES ARRAY [ABSENT] checks a page of a fleet's
daemon showing node NODE (MEM: NODE's /v1/memory): the selector lists NODES (comma-separated,
this node first) with NODE selected, the header names NODE, the spaces are NODE's, ARRAY
(stored on NODE) is shown and ABSENT (stored on another node) is not."""
import html.parser
import json
import sys


class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.spaces, self.arrays, self.errors, self.updated = {}, {}, [], False
        self.operations = {}
        self._in_error = False
        self.charts, self.losses, self.timeline = {}, {}, {}
        self._chart = None
        self.host, self.nodes, self.selected, self.selector_hidden = "", [], None, None
        self._in_host = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-space" in a:
            self.spaces[a["data-space"]] = {k: int(a["data-" + k]) for k in ("used", "peak", "limit")}
        if "data-operation" in a:
            self.operations[a["data-operation"]] = (int(a["data-done"]), int(a["data-total"]))
        if "data-array" in a:
            self.arrays[a["data-array"]] = a.get("data-placement", "")
        if "data-pool-chart" in a:
            self._chart = self.charts[a["data-pool-chart"]] = {"attrs": a, "lines": {}}
        if "data-loss-model" in a:
            self._chart = self.losses[a["data-loss-model"]] = {"attrs": a, "lines": {}}
        if "data-transfer-chart" in a or "data-requests-chart" in a:
            self._chart = None
        if tag == "polyline" and self._chart is not None:
            self._chart["lines"][a["data-series"]] = a
        if "data-above" in a and self._chart is not None:
            self._chart["lines"][a["data-above"]] = a
        if "data-timeline-op" in a:
            self.timeline[a["data-timeline-op"]] = a.get("data-state", "")
        if tag == "body" and "data-updated" in a:
            self.updated = True
        if a.get("id") == "nodes":
            self.selector_hidden = "hidden" in a
        if tag == "option" and "value" in a:
            self.nodes.append(a["value"])
            if "selected" in a:
                self.selected = a["value"]
        self._in_host = a.get("id") == "host"
        self._in_error = a.get("id") == "error"
        if self._in_error and "display: block" in a.get("style", ""):
            self.errors.append("")

    def handle_data(self, data):
        if self._in_host:
            self.host += data
        if self._in_error and self.errors:
            self.errors[-1] += data


def parse(path):
    d = Dom()
    d.feed(open(path, encoding="utf-8").read())
    return d


def spaces(mem):
    return {f'{s["device"]}/{s["memory_kind"]}': s for s in json.load(open(mem))["spaces"]}


def check(label, dom, mem):
    if not dom.updated:
        sys.exit(f"{label}: the page never finished a poll (errors: {dom.errors})")
    if dom.errors:
        sys.exit(f"{label}: the page shows an error: {dom.errors}")
    want = spaces(mem)
    if set(dom.spaces) != set(want):
        sys.exit(f"{label}: the page draws spaces {sorted(dom.spaces)}, /v1/memory lists {sorted(want)}")
    for key, s in want.items():
        if dom.spaces[key]["limit"] != s["bytes_limit"]:
            sys.exit(f"{label}: {key} limit {dom.spaces[key]['limit']}, /v1/memory says {s['bytes_limit']}")
    return want


def check_history(hist_path, dom_path, pool, space, nbytes, model, op):
    dom, hist = parse(dom_path), json.load(open(hist_path))
    if not dom.updated or dom.errors:
        sys.exit(f"history: the page did not draw (errors: {dom.errors})")
    if pool not in dom.charts:
        sys.exit(f"history: no chart of pool {pool} (charts: {sorted(dom.charts)})")
    chart = dom.charts[pool]
    line = chart["lines"].get(space)
    if line is None:
        sys.exit(f"history: pool {pool}'s chart has no line for {space}: {sorted(chart['lines'])}")
    want = next(s["bytes_in_use"] for s in hist["spaces"]
                if f'{s["device"]}/{s["memory_kind"]}' == space)
    top, last = int(line["data-max"]), int(line["data-last"])
    if last != want[-1]:
        sys.exit(f"history: {space} ends at {last} on the page, the history says {want[-1]}")
    if top - last < nbytes:
        sys.exit(f"history: {space} peaks at {top}, ends at {last}: no spike of {nbytes} bytes")
    ys = [float(p.split(",")[1]) for p in line["points"].split()]
    if max(ys) - min(ys) < 20:
        sys.exit(f"history: {space}'s line is flat on the page (y from {min(ys)} to {max(ys)})")
    limit = chart["lines"].get("limit")
    plimit = next(p["bytes_limit"][-1] for p in hist["pools"] if p["pool"] == pool)
    if limit is None or int(limit["data-last"]) != plimit:
        sys.exit(f"history: pool {pool}'s limit {plimit} is not shown ({limit})")
    loss = dom.losses.get(model)
    if loss is None or loss["attrs"]["data-op"] != op or int(loss["attrs"]["data-steps"]) < 1:
        sys.exit(f"history: no loss curve of {op} for model {model}: {loss and loss['attrs']}")
    if dom.timeline.get(op) != "CANCELLED":
        sys.exit(f"history: {op} not on the timeline as cancelled: {dom.timeline.get(op)}")
    print(f"dashboard: {space} spike of {top - last} bytes drawn in {pool} over "
          f"{chart['attrs']['data-rows']} samples, limit {plimit}; {model}'s loss curve over "
          f"{loss['attrs']['data-steps']} steps; {len(dom.timeline)} operations on the timeline")


def check_fleet(mem, dom_path, node, nodes, array, absent=None):
    dom = parse(dom_path)
    n = len(check(f"node {node}", dom, mem))
    if dom.selector_hidden is not False:
        sys.exit(f"fleet: the node selector is not shown (hidden: {dom.selector_hidden})")
    if dom.nodes != nodes.split(","):
        sys.exit(f"fleet: the selector lists {dom.nodes}, /v1/fleet has {nodes}")
    if dom.selected != node:
        sys.exit(f"fleet: the selector has {dom.selected!r} selected, want {node!r}")
    if dom.host.strip() != node:
        sys.exit(f"fleet: the header names host {dom.host.strip()!r}, want {node!r}")
    if array not in dom.arrays:
        sys.exit(f"fleet: {node}'s array '{array}' not shown (rows: {sorted(dom.arrays)})")
    if absent and absent in dom.arrays:
        sys.exit(f"fleet: array '{absent}' of another node shown on {node}'s page")
    print(f"dashboard: node {node} of {nodes} shown: {n} spaces, array '{array}'")


def main():
    if sys.argv[1] == "--fleet":
        check_fleet(*sys.argv[2:])
        return
    if sys.argv[1] == "--history":
        check_history(*sys.argv[2:6], int(sys.argv[6]), *sys.argv[7:9])
        return
    if sys.argv[1] == "--spaces":
        n = len(check("page", parse(sys.argv[3]), sys.argv[2]))
        print(f"dashboard: {n} spaces drawn")
        return
    mem0, dom0, mem1, dom1, array, space, nbytes = sys.argv[1:8]
    nbytes = int(nbytes)
    before, after = parse(dom0), parse(dom1)
    check("before", before, mem0)
    check("after", after, mem1)
    if array in before.arrays:
        sys.exit(f"before: array '{array}' shown before its upload")
    if array not in after.arrays:
        sys.exit(f"after: array '{array}' not shown (rows: {sorted(after.arrays)})")
    if after.arrays[array] != space:
        sys.exit(f"after: array '{array}' placed at '{after.arrays[array]}', want '{space}'")
    grown = after.spaces[space]["used"] - before.spaces[space]["used"]
    if grown != nbytes:
        sys.exit(f"after: {space} in use grew by {grown} bytes on the page, want {nbytes}")
    if after.spaces[space]["peak"] < after.spaces[space]["used"]:
        sys.exit(f"after: {space} peak below in use: {after.spaces[space]}")
    if len(sys.argv) > 9:
        op, total = sys.argv[8], int(sys.argv[9])
        if op not in after.operations:
            sys.exit(f"after: operation {op} in flight not shown (rows: {sorted(after.operations)})")
        if after.operations[op][1] != total:
            sys.exit(f"after: operation {op} shows a total of {after.operations[op][1]}, want {total}")
    print(f"dashboard: {len(after.spaces)} spaces drawn; '{array}' shown on {space}, +{grown} bytes; "
          f"{len(after.operations)} operation(s) in flight shown")


if __name__ == "__main__":
    main()
