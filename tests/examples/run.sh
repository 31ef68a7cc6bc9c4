#!/usr/bin/env bash
# tests/examples/run.sh - runs every examples/*.sh workflow against a live
# tstaged on two simulated devices, at small sizes, and fails on any error
# or on output that shows the workflow did not do its job.
#
#   tests/examples/run.sh [build/tstaged]
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
daemon=${1:-$root/build/tstaged}
work=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
command -v jq >/dev/null || { echo "examples: jq is missing (scripts/deps.sh installs it)" >&2; exit 1; }

"$daemon" --port 0 --port-file "$work/port" --sim-devices 2 --sim-device-memory 256MiB \
	--no-cuda --data-dir "$work" --log-level warn 2>"$work/daemon.log" &
pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "examples: the daemon did not start" >&2; cat "$work/daemon.log" >&2; exit 1; }
export TSTAGE_URL="http://127.0.0.1:$(cat "$work/port")"
failed=0

# check NAME PATTERN... -- COMMAND...: the command succeeds and prints a
# line matching each PATTERN
check() {
	local name=$1 wants=() ok=1
	shift
	while [ "$1" != -- ]; do wants+=("$1"); shift; done
	shift
	"$@" >"$work/$name.out" 2>&1 || ok=0
	for w in "${wants[@]}"; do grep -Eq -- "$w" "$work/$name.out" || ok=0; done
	if [ $ok -eq 1 ]; then
		echo "examples: ok   $name"
	else
		echo "examples: FAIL $name (want /${wants[*]}/):"
		sed 's/^/    /' "$work/$name.out" | tail -20
		failed=1
	fi
}

check token_dataset 'the 16 rows match the file' 'batch 4: \[16,128\] on sim:0/device' -- \
	env ROWS=512 SEQ=128 BATCH=16 BATCHES=4 "$root/examples/token_dataset.sh"
check offload_step 'peak device bytes: predicted ([0-9]+), measured \1$' 'SUCCEEDED: 16/16 steps' -- \
	env LAYERS=2 D_MODEL=64 D_HIDDEN=128 BATCH=16 STEPS=4 "$root/examples/offload_step.sh"

# the poll shows the spaces and an operation in flight: a long run, cancelled after
op=$(curl -fsS -X POST -d '{"inputs": "x", "targets": "t", "steps": 1000000}' "$TSTAGE_URL/v1/models/mlp:step" |
	jq -r .name)
check dashboard_poll 'sim:1/pinned_host +[0-9.]+ MiB used +[0-9.]+ peak +[0-9.]+ limit' \
	"op $op step mlp RUNNING steps_done=[0-9]+ steps_total=1000000" -- env COUNT=2 INTERVAL=0.3 "$root/examples/dashboard_poll.sh"
curl -fsS -X POST "$TSTAGE_URL/v1/$op:cancel" >/dev/null

kill -0 "$pid" 2>/dev/null || { echo "examples: the daemon died" >&2; failed=1; }
exit $failed
