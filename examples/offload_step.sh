#!/usr/bin/env bash
# examples/offload_step.sh - a model whose Adam state lives in pinned host
# memory: analysed before it runs, then trained, the memory analysis checked
# against what the device measured.
#
# Creates an MLP (LAYERS x D_MODEL, hidden D_HIDDEN) with its parameters on
# the device and Adam's mu/nu on pinned_host, asks :analyze for the plan of
# a BATCH-row step (XLA's memory_analysis names), runs STEPS steps on an
# uploaded batch, and prints the losses and the predicted and measured peak
# device bytes (they are equal). Then starts a longer run as an operation
# and follows its progress. Needs curl and jq.
#
#   TSTAGE_URL=http://127.0.0.1:8470 LAYERS=4 D_MODEL=256 D_HIDDEN=1024 BATCH=64 STEPS=8 \
#       examples/offload_step.sh
set -euo pipefail
url=${TSTAGE_URL:-http://127.0.0.1:8470}
layers=${LAYERS:-4} d=${D_MODEL:-256} h=${D_HIDDEN:-1024} batch=${BATCH:-64} steps=${STEPS:-8}
auth=()
[ -n "${TSTAGE_TOKEN_FILE:-}" ] && auth=(-H "Authorization: Bearer $(cat "$TSTAGE_TOKEN_FILE")")
api() { curl -fsS "${auth[@]}" "$@"; }
dev=${DEVICE:-$(api "$url/v1/devices" | jq -r '[.devices[] | select(.backend != "cpu")][0].id')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# float32 [batch, d] from four values (little-endian bytes), repeated
floats() { # FILE A B C D (each as four \x escapes)
	local out=$1 n=$((batch * d / 4)) i
	shift
	: >"$out"
	for ((i = 0; i < n; i++)); do printf '%b%b%b%b' "$@"; done >"$out"
}
floats "$work/x.f32" '\x00\x00\x00\x3f' '\x00\x00\x80\xbe' '\x00\x00\x00\x3e' '\x00\x00\x80\x3f'
floats "$work/t.f32" '\x00\x00\x80\x3e' '\x00\x00\x00\x00' '\x00\x00\x80\x3e' '\x00\x00\x00\x3f'
api -X PUT --data-binary @"$work/x.f32" "$url/v1/arrays/x?dtype=float32&shape=$batch,$d&device=$dev" >/dev/null
api -X PUT --data-binary @"$work/t.f32" "$url/v1/arrays/t?dtype=float32&shape=$batch,$d&device=$dev" >/dev/null

# ---- the model, optimizer state offloaded (a model of that name is replaced)
curl -s "${auth[@]}" -o /dev/null -X DELETE "$url/v1/models/mlp"
api -X POST "$url/v1/models?wait=true" -d "{\"name\": \"mlp\",
	\"mlp\": {\"layers\": $layers, \"d_model\": $d, \"d_hidden\": $h, \"activation\": \"gelu\", \"residual\": true},
	\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", \"learning_rate\": 1e-3},
	\"placement\": {\"device\": \"$dev\", \"params\": \"device\", \"opt_state\": \"pinned_host\"}}" |
	jq -r '"model \(.name): \(.state), arrays \(.arrays | keys | join(" "))"'

# ---- the plan, before anything runs
api -X POST "$url/v1/models/mlp:analyze" -d "{\"batch\": [$batch, $d]}" |
	jq -r '"analysis: argument \(.argument_size_in_bytes) B, temp \(.temp_size_in_bytes) B, " +
	       "host \(.host_argument_size_in_bytes) B, peak \(.peak_device_bytes) B on the device"'

# ---- steps, answered when done
api -X POST "$url/v1/models/mlp:step?wait=true" -d "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": $steps}" \
	>"$work/step.json"
jq -r '"losses: \(.losses | map(. * 1e6 | round / 1e6) | join(" "))",
       "peak device bytes: predicted \(.predicted_peak_device_bytes), measured \(.measured_peak_device_bytes)",
       "moved per call: h2d \(.bytes_moved.h2d) B, d2h \(.bytes_moved.d2h) B"' "$work/step.json"
jq -e '.predicted_peak_device_bytes == .measured_peak_device_bytes' "$work/step.json" >/dev/null ||
	{ echo "the measured peak differs from the prediction" >&2; exit 1; }
jq -e '.losses[-1] < .losses[0]' "$work/step.json" >/dev/null ||
	{ echo "the loss did not fall" >&2; exit 1; }

# ---- a longer run as an operation, followed until done
op=$(api -X POST "$url/v1/models/mlp:step" -d "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": $((steps * 4))}")
name=$(jq -r .name <<<"$op")
while :; do
	op=$(api "$url/v1/$name")
	jq -r '(.metadata // .) as $m | "\($m.state): \($m.progress.steps_done)/\($m.progress.steps_total) steps"' <<<"$op"
	[ "$(jq -r .done <<<"$op")" = true ] && break
	sleep 0.2
done
jq -e '.error == null' <<<"$op" >/dev/null || { jq .error <<<"$op" >&2; exit 1; }
jq -r '(.response // .result) | "\(.steps) more steps, last loss \(.losses[-1])"' <<<"$op"
api "$url/v1/models/mlp" | jq -r '"model steps: \(.steps)"'
