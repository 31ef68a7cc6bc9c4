#!/usr/bin/env bash
# trace.sh - GET /v1/trace of a known step, loaded by Perfetto's trace
# processor (the perfetto package from PyPI) where its shell can start, else
# checked by the Trace Event Format's rules (tests/api/check_trace.py says
# which), and the step's copies and kernels checked in order: an MLP of 3
# layers with its weights on pinned_host (prefetch_depth 0) takes one step on
# sim:0 while the trace records; the bytes copied are what :analyze planned.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/api/lib.sh

venv perfetto
start_daemon trace
base=http://127.0.0.1:$PORT
device=${TRACE_DEVICE:-sim:0}   # cuda:0 where the daemon sees a GPU (or the CPU stand-in)
layers=3 d_model=32 d_hidden=64
curl -sf -o /dev/null -X POST "$base/v1/models?wait=true" -d "{\"name\": \"tm\",
	\"mlp\": {\"layers\": $layers, \"d_model\": $d_model, \"d_hidden\": $d_hidden, \"activation\": \"relu\"},
	\"loss\": \"sum\", \"init\": {\"seed\": 1, \"scale\": 0.05},
	\"placement\": {\"device\": \"$device\", \"params\": \"pinned_host\", \"prefetch_depth\": 0}}"
head -c $((16 * d_model * 4)) /dev/urandom >"$API_TMP/x"
curl -sf -o /dev/null -X PUT --data-binary "@$API_TMP/x" \
	"$base/v1/arrays/tm.x?dtype=float32&shape=16,$d_model&device=$device"
curl -sf -X POST "$base/v1/models/tm:analyze" -d "{\"batch\": [16, $d_model]}" >"$API_TMP/analysis.json"
curl -sf "$base/v1/trace?seconds=2" -o "$API_TMP/trace.json" &
tracer=$!
sleep 0.5
curl -sf -o /dev/null -X POST "$base/v1/models/tm:step?wait=true" -d '{"inputs": "tm.x", "steps": 1}'
wait "$tracer"
"$API_VENV/bin/python" tests/api/check_trace.py "$API_TMP/trace.json" "$API_TMP/analysis.json" \
	"$device" "$layers" $((d_model * d_hidden * 4))
