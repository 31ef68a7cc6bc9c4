#!/usr/bin/env bash
# CI: the metrics, alerts and dashboard against the tools that consume them.
#   promtool check metrics   a live scrape of tstaged, after it has worked
#   promtool check rules     deploy/prometheus/alerts.yaml
#   promtool test rules      deploy/prometheus/alerts_test.yaml
#   a real Prometheus        on loopback in a temporary directory, scraping
#                            that tstaged every second with the alert rules
#                            loaded; after a few scrapes every expression of
#                            deploy/grafana/dashboards/tstage.json and of
#                            alerts.yaml is evaluated through its HTTP API.
# The rule for "returns data": a query must answer success with at least one
# series. A dashboard expression is evaluated with $instance as .* and
# $__rate_interval as 15s. An alert expression is evaluated without its
# threshold comparison (the part before its last top-level >, <, ==, !=, >=,
# <=): the rule as written returns nothing while all is well, which is the
# point of it; Prometheus itself must report every rule loaded and healthy.
# Needs the Debian prometheus package (promtool, prometheus) and python3-yaml
# (scripts/deps.sh). Exits non-zero on any finding.
#   tests/deploy/prometheus.sh [TSTAGED]   (default $TSTAGED, then build/tstaged)
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=${1:-${TSTAGED:-build/tstaged}}
for tool in promtool prometheus python3; do
	command -v "$tool" >/dev/null || {
		echo "prometheus.sh: $tool not found (scripts/deps.sh installs it)" >&2
		exit 1
	}
done
if ! [ -x "$bin" ]; then
	echo "== building $bin"
	make -j"$(nproc)" "$bin"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tstage-prom.XXXXXX")
ts_pid='' prom_pid=''
cleanup() {
	[ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
	[ -n "$ts_pid" ] && kill "$ts_pid" 2>/dev/null && wait "$ts_pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

failed=()
step() {
	local name=$1
	shift
	echo "== $name"
	if ! "$@"; then
		echo "FAILED: $name" >&2
		failed+=("$name")
	fi
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for_file() {
	for _ in $(seq 100); do
		[ -s "$1" ] && return 0
		sleep 0.1
	done
	echo "prometheus.sh: $1 did not appear" >&2
	return 1
}

step "promtool check rules" promtool check rules deploy/prometheus/alerts.yaml
step "promtool test rules" promtool test rules deploy/prometheus/alerts_test.yaml

echo "== starting $bin"
"$bin" --port 0 --port-file "$tmp/port" --sim-devices 2 --sim-device-memory 64MiB --no-cuda \
	--log-level warn 2>"$tmp/tstaged.log" &
ts_pid=$!
wait_for_file "$tmp/port"
ts_port=$(cat "$tmp/port")

# work, so that counters, histograms and the operation series have moved
python3 - "$ts_port" <<'EOF'
import json, sys, urllib.request

base = "http://127.0.0.1:%s" % sys.argv[1]

def call(method, path, body=b"", ctype=None):
    req = urllib.request.Request(base + path, data=body if method != "GET" else None, method=method)
    if ctype:
        req.add_header("Content-Type", ctype)
    with urllib.request.urlopen(req) as r:
        return r.status, r.read()

call("PUT", "/v1/arrays/w?dtype=float32&shape=256,64&device=sim:0", bytes(256 * 64 * 4))
call("POST", "/v1/arrays/w:put?wait=true", b'{"device": "sim:1", "memory_kind": "device"}',
     "application/json")
call("POST", "/v1/models?wait=true", b'{"name": "m", "mlp": {"layers": 1, "d_model": 4}}',
     "application/json")
call("PUT", "/v1/arrays/m.x?dtype=float32&shape=8,4", bytes(8 * 4 * 4))
call("POST", "/v1/models/m:step?wait=true", b'{"inputs": "m.x", "steps": 2}', "application/json")
call("GET", "/v1/memory")
EOF

scrape() {
	python3 -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1]).read())' \
		"http://127.0.0.1:$ts_port/metrics"
}
check_scrape() {
	scrape >"$tmp/scrape.prom" && promtool check metrics <"$tmp/scrape.prom"
}
step "promtool check metrics (live scrape)" check_scrape

prom_port=$(free_port)
cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $PWD/deploy/prometheus/alerts.yaml
scrape_configs:
  - job_name: tstaged
    static_configs:
      - targets: ['127.0.0.1:$ts_port']
EOF
echo "== starting prometheus on 127.0.0.1:$prom_port"
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
	--web.listen-address="127.0.0.1:$prom_port" --log.level=warn 2>"$tmp/prometheus.log" &
prom_pid=$!

evaluate() {
	python3 - "$prom_port" <<'EOF'
import json, re, sys, time, urllib.parse, urllib.request
import yaml

api = "http://127.0.0.1:%s" % sys.argv[1]

def get(path, **params):
    url = api + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)

def query(expr):
    try:
        out = get("/api/v1/query", query=expr)
    except urllib.error.HTTPError as e:
        return "error %s: %s" % (e.code, e.read().decode(errors="replace")[:300])
    if out.get("status") != "success":
        return "status %s" % out
    if not out["data"]["result"]:
        return "no data"
    return None

# Prometheus up, the target scraped at least 5 times, the rules evaluated
deadline = time.time() + 60
while True:
    try:
        if get("/api/v1/query", query='count_over_time(tstage_uptime_seconds[1m]) >= 5')["data"]["result"]:
            groups = get("/api/v1/rules")["data"]["groups"]
            if groups and all(r.get("lastEvaluation", "").startswith("2") and
                              not r["lastEvaluation"].startswith("0001")
                              for g in groups for r in g["rules"]):
                break
    except Exception:
        pass
    if time.time() > deadline:
        sys.exit("prometheus did not scrape tstaged 5 times and evaluate its rules in 60 s")
    time.sleep(0.5)

def strip_threshold(expr):
    """The expression before its last comparison at the top level."""
    depth, quote, last, i = 0, None, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and expr.startswith(("==", "!=", ">=", "<="), i):
            last = i
            i += 1
        elif depth == 0 and c in "<>":
            last = i
        i += 1
    return expr[:last].strip() if last is not None else expr

problems, checked = [], 0
rules = yaml.safe_load(open("deploy/prometheus/alerts.yaml"))
loaded = {r["name"]: r for g in get("/api/v1/rules")["data"]["groups"] for r in g["rules"]}
for group in rules["groups"]:
    for rule in group["rules"]:
        name = rule.get("alert") or rule.get("record")
        state = loaded.get(name)
        if not state:
            problems.append("alert %s: not loaded by prometheus" % name)
        elif state.get("health") != "ok":
            problems.append("alert %s: health %s (%s)" % (name, state.get("health"),
                                                          state.get("lastError")))
        expr = strip_threshold(rule["expr"])
        why = query(expr)
        checked += 1
        if why:
            problems.append("alert %s: %s: %s" % (name, expr, why))

dash = json.load(open("deploy/grafana/dashboards/tstage.json"))
for var in dash.get("templating", {}).get("list", []):
    q = var.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    m = re.match(r"label_values\((.*),\s*\w+\)$", q or "")
    if m:
        checked += 1
        why = query(m.group(1))
        if why:
            problems.append("variable %s: %s: %s" % (var["name"], m.group(1), why))
for panel in dash["panels"]:
    for target in panel.get("targets", []):
        expr = target["expr"].replace("$__rate_interval", "15s").replace("$instance", ".*")
        checked += 1
        why = query(expr)
        if why:
            problems.append("panel '%s' %s: %s: %s" % (panel["title"], target["refId"], expr, why))

for p in problems:
    print("  " + p)
print("%d expressions evaluated, %d without data or in error" % (checked, len(problems)))
sys.exit(1 if problems else 0)
EOF
}
step "live prometheus: every dashboard and alert expression returns data" evaluate

if [ ${#failed[@]} -gt 0 ]; then
	echo "prometheus.sh: failed: ${failed[*]}" >&2
	sed -n '1,40p' "$tmp/prometheus.log" >&2 || true
	exit 1
fi
echo "prometheus.sh: all checks passed"
