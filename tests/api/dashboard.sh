#!/usr/bin/env bash
# dashboard.sh - GET /dashboard in headless Chromium against a live tstaged:
# the page draws a bar for every (device, memory kind) space /v1/memory
# lists, and after an upload it shows the array with its placement and the
# space's bytes in use grown by the array's size, and a training run in
# flight with its progress in steps; the topology panel shows the peer
# matrix's text; a screenshot goes to build/dashboard.png. Once the array is
# deleted and the run cancelled, the history draws the upload as a spike in
# its pool's chart (checked against /v1/memory/history), the run's loss
# curve and the run on the timeline; a screenshot goes to
# build/dashboard-history.png. Then, with --token-file, the page (and the spec) are
# behind the token as the API is.
#
# Chromium runs offline (--headless, no sandbox as root, no first-run
# requests); --virtual-time-budget lets the page's fetches and first draw
# finish before --dump-dom writes the DOM.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/api/lib.sh

CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$CHROMIUM" ] || { echo "dashboard: no chromium (scripts/deps.sh installs it)" >&2; exit 1; }

chrome() {
	timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
		--no-first-run --disable-extensions --disable-background-networking \
		--user-data-dir="$API_TMP/chrome" --virtual-time-budget=4000 "$@" 2>>"$API_TMP/chrome.log"
}

start_daemon dash
base=http://127.0.0.1:$PORT
curl -sf "$base/v1/memory" >"$API_TMP/memory0.json"
chrome --dump-dom "$base/dashboard" >"$API_TMP/before.html"
# the topology panel shows the peer matrix as GET /v1/topology's text has it
curl -sf "$base/v1/topology" >"$API_TMP/topology.json"
python3 - "$API_TMP/topology.json" "$API_TMP/before.html" <<'PY'
import html, json, re, sys
want = json.load(open(sys.argv[1]))["peers"]["text"]
m = re.search(r'<pre id="topology"[^>]*>(.*?)</pre>', open(sys.argv[2]).read(), re.S)
assert m and html.unescape(m.group(1)) == want, "topology panel: %r" % (m and m.group(1))
print("dashboard: topology panel shows the peer matrix")
PY

# 1 MiB on sim:0's pinned_host, committed
head -c 1048576 /dev/urandom >"$API_TMP/mib"
curl -sf -o /dev/null -X PUT --data-binary "@$API_TMP/mib" \
	"$base/v1/arrays/dash.tokens?dtype=uint16&shape=512,1024&device=sim:0&memory_kind=pinned_host"
curl -sf "$base/v1/memory" >"$API_TMP/memory1.json"
# and a training run in flight: a 10-layer MLP stepping until cancelled
curl -sf -o /dev/null -X POST "$base/v1/models?wait=true" \
	-d '{"name": "dash", "mlp": {"layers": 10, "d_model": 256, "d_hidden": 1024}}'
head -c 262144 /dev/zero >"$API_TMP/x"
curl -sf -o /dev/null -X PUT --data-binary "@$API_TMP/x" "$base/v1/arrays/dash.x?dtype=float32&shape=256,256"
op=$(curl -sf -X POST "$base/v1/models/dash:step" -d '{"inputs": "dash.x", "steps": 1000000}' |
	python3 -c 'import json, sys; print(json.load(sys.stdin)["metadata"]["id"])')
chrome --dump-dom "$base/dashboard" >"$API_TMP/after.html"
mkdir -p build
chrome --window-size=1280,1000 --hide-scrollbars --screenshot="$PWD/build/dashboard.png" \
	"$base/dashboard" >/dev/null
[ -s build/dashboard.png ] || { echo "dashboard: no screenshot written" >&2; exit 1; }

curl -sf -o /dev/null -X POST "$base/v1/operations/$op:cancel"
python3 tests/api/check_dashboard.py "$API_TMP/memory0.json" "$API_TMP/before.html" \
	"$API_TMP/memory1.json" "$API_TMP/after.html" dash.tokens sim:0/pinned_host 1048576 \
	"$op" 1000000

# the spike: the array gone, a sample or two later the history still shows it
curl -sf -o /dev/null -X DELETE "$base/v1/arrays/dash.tokens"
sleep 2.5
chrome --dump-dom "$base/dashboard" >"$API_TMP/history.html"
curl -sf "$base/v1/memory/history?since=15m" >"$API_TMP/history.json"
chrome --window-size=1280,2600 --hide-scrollbars --screenshot="$PWD/build/dashboard-history.png" \
	"$base/dashboard" >/dev/null
[ -s build/dashboard-history.png ] || { echo "dashboard: no history screenshot" >&2; exit 1; }
python3 tests/api/check_dashboard.py --history "$API_TMP/history.json" "$API_TMP/history.html" \
	host/pinned_host sim:0/pinned_host 1048576 dash "$op"

# a fleet of two (its own token): node dashb (one sim device, its own
# array) and node dasha, which lists it in --peers. dasha's page shows the
# node selector; with #host=dashb it draws dashb's memory and arrays, read
# through dasha (?host=), dasha's own with none, and dashb's once it is
# chosen in the selector (tests/api/choose_node.py drives Chromium over its
# DevTools protocol).
printf 'fleet-secret-0123456789\n' >"$API_TMP/ftoken"
start_daemon dashb --host-name dashb --sim-devices 1 --sim-device-memory 256MiB \
	--token-file "$API_TMP/ftoken"
bbase=http://127.0.0.1:$PORT
start_daemon dasha --host-name dasha --peers "$bbase" --token-file "$API_TMP/ftoken"
abase=http://127.0.0.1:$PORT
fcurl() { curl -sf -u "ops:fleet-secret-0123456789" "$@"; }
fcurl -o /dev/null -X PUT --data-binary "@$API_TMP/x" "$bbase/v1/arrays/onb.x?dtype=float32&shape=256,256"
fcurl -o /dev/null -X PUT --data-binary "@$API_TMP/x" "$abase/v1/arrays/ona.x?dtype=float32&shape=256,256"
for _ in $(seq 50); do
	fcurl "$abase/v1/fleet" | python3 -c 'import json, sys
sys.exit(not all(n["reachable"] for n in json.load(sys.stdin)["nodes"]))' && break
	sleep 0.1
done
fcurl "$bbase/v1/memory" >"$API_TMP/memb.json"
fcurl "$abase/v1/memory" >"$API_TMP/mema.json"
furl="http://ops:fleet-secret-0123456789@127.0.0.1:$PORT/dashboard"
chrome --dump-dom "$furl#host=dashb" >"$API_TMP/nodeb.html"
chrome --window-size=1280,1000 --hide-scrollbars --screenshot="$PWD/build/dashboard-fleet.png" \
	"$furl#host=dashb" >/dev/null
[ -s build/dashboard-fleet.png ] || { echo "dashboard: no fleet screenshot" >&2; exit 1; }
python3 tests/api/check_dashboard.py --fleet "$API_TMP/memb.json" "$API_TMP/nodeb.html" \
	dashb dasha,dashb onb.x ona.x
chrome --dump-dom "$furl" >"$API_TMP/nodea.html"
python3 tests/api/check_dashboard.py --fleet "$API_TMP/mema.json" "$API_TMP/nodea.html" \
	dasha dasha,dashb ona.x onb.x
# and as a user does: dasha's page, then dashb chosen in the selector
venv websocket-client
"$API_VENV/bin/python" tests/api/choose_node.py "$CHROMIUM" "$furl" dashb "$API_TMP/chosen.html"
python3 tests/api/check_dashboard.py --fleet "$API_TMP/memb.json" "$API_TMP/chosen.html" \
	dashb dasha,dashb onb.x ona.x

# behind the token, as /v1 is; the health routes stay open. A browser is
# asked for the token (Basic, the token as the password): Chromium given it
# in the URL draws the page from calls that carry it.
token=dash-secret-0123456789
printf '%s\n' "$token" >"$API_TMP/token"
start_daemon tok --token-file "$API_TMP/token"
tbase=http://127.0.0.1:$PORT
status() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
for path in /dashboard /openapi.yaml; do
	for how in none bearer basic wrong; do
		case $how in
		none) code=$(status "$tbase$path"); want=401 ;;
		bearer) code=$(status -H "Authorization: Bearer $token" "$tbase$path"); want=200 ;;
		basic) code=$(status -u "ops:$token" "$tbase$path"); want=200 ;;
		wrong) code=$(status -u "ops:x$token" "$tbase$path"); want=401 ;;
		esac
		[ "$code" = "$want" ] ||
			{ echo "dashboard: $path, token $how: $code, want $want" >&2; exit 1; }
	done
done
curl -s -D - -o /dev/null "$tbase/dashboard" | grep -qi '^WWW-Authenticate: Basic' ||
	{ echo "dashboard: no Basic challenge on /dashboard" >&2; exit 1; }
[ "$(status "$tbase/livez")" = 200 ] || { echo "dashboard: /livez behind a token" >&2; exit 1; }
curl -sf -u "ops:$token" "$tbase/v1/memory" >"$API_TMP/memory2.json"
chrome --dump-dom "http://ops:$token@127.0.0.1:$PORT/dashboard" >"$API_TMP/token.html"
python3 tests/api/check_dashboard.py --spaces "$API_TMP/memory2.json" "$API_TMP/token.html"
echo "dashboard: spaces drawn, upload shown, spike in the history, screenshots in" \
	"build/dashboard.png and build/dashboard-history.png, a fleet's node selector" \
	"(build/dashboard-fleet.png), token enforced"
