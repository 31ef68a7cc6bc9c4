#!/usr/bin/env bash
# examples/token_dataset.sh - a uint16 token dataset in pinned host memory,
# streamed to the accelerator a batch of rows at a time.
#
# Writes a safetensors file of ROWS sequences of SEQ uint16 token ids (random
# ids here; a tokenizer's output in real use), imports it into pinned_host
# (it never lands on the device), then for BATCHES batches gathers BATCH
# random rows onto the device (only those rows move) and fetches one batch
# to the client in one request (?rows=). Needs curl and jq.
#
#   TSTAGE_URL=http://127.0.0.1:8470 ROWS=4096 SEQ=1024 BATCH=32 BATCHES=8 \
#       examples/token_dataset.sh
#
# A dataset already on the server's disk (below --data-dir) is imported
# without crossing HTTP:
#   curl -s -X POST -H 'Content-Type: application/json' \
#        -d '{"path": "tokens.safetensors"}' \
#        "$TSTAGE_URL/v1/arrays:import?memory_kind=pinned_host&wait=true"
set -euo pipefail
url=${TSTAGE_URL:-http://127.0.0.1:8470}
rows=${ROWS:-4096} seq=${SEQ:-1024} batch=${BATCH:-32} batches=${BATCHES:-8}
auth=()
[ -n "${TSTAGE_TOKEN_FILE:-}" ] && auth=(-H "Authorization: Bearer $(cat "$TSTAGE_TOKEN_FILE")")
api() { curl -fsS "${auth[@]}" "$@"; }
# the first accelerator: a GPU, else a simulated device
dev=${DEVICE:-$(api "$url/v1/devices" | jq -r '[.devices[] | select(.backend != "cpu")][0].id')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- a safetensors file: 8-byte little-endian header size, JSON header, data
nbytes=$((rows * seq * 2))
header=$(printf '{"tokens":{"dtype":"U16","shape":[%d,%d],"data_offsets":[0,%d]}}' \
	"$rows" "$seq" "$nbytes")
while [ $(( ${#header} % 8 )) -ne 0 ]; do header+=' '; done
size=""
for i in 0 1 2 3 4 5 6 7; do size+=$(printf '\\x%02x' $(( (${#header} >> (8 * i)) & 255 ))); done
{ printf '%b' "$size"; printf '%s' "$header"; head -c "$nbytes" /dev/urandom; } >"$work/tokens.safetensors"

# ---- import into pinned host memory, replacing an earlier run's
api -X POST --data-binary @"$work/tokens.safetensors" \
	"$url/v1/arrays:import?device=$dev&memory_kind=pinned_host&overwrite=true" >/dev/null
api "$url/v1/arrays/tokens" |
	jq -r '"tokens: \(.dtype) \(.shape) on \(.sharding.device)/\(.sharding.memory_kind)"'

# ---- batches of random rows onto the device
for b in $(seq 1 "$batches"); do
	ids=$(shuf -i "0-$((rows - 1))" -n "$batch" | paste -sd, -)
	api -X POST -d "{\"rows\": [$ids], \"out\": {\"name\": \"batch\", \"device\": \"$dev\", \"memory_kind\": \"device\"}}" \
		"$url/v1/arrays/tokens:gather?wait=true" >/dev/null
	api "$url/v1/arrays/batch" | jq -r --arg b "$b" \
		'"batch \($b): \(.shape) on \(.sharding.device)/\(.sharding.memory_kind)"'
done

# ---- the last batch's rows to the client, in the order asked, in one request
api -D "$work/headers" -o "$work/batch.raw" "$url/v1/arrays/tokens/data?rows=$ids"
got=$(stat -c %s "$work/batch.raw")
[ "$got" -eq $((batch * seq * 2)) ] || { echo "batch: $got bytes, want $((batch * seq * 2))" >&2; exit 1; }
grep -i '^x-tstage-shape' "$work/headers" | tr -d '\r'
# each row is the file's row, in the order asked
k=0
data_at=$((8 + ${#header}))
for r in ${ids//,/ }; do
	cmp -s <(tail -c +$((data_at + r * seq * 2 + 1)) "$work/tokens.safetensors" | head -c $((seq * 2))) \
		<(tail -c +$((k * seq * 2 + 1)) "$work/batch.raw" | head -c $((seq * 2))) ||
		{ echo "row $r (batch row $k) differs from the file" >&2; exit 1; }
	k=$((k + 1))
done
echo "the $k rows match the file"
api "$url/v1/memory" | jq -r --arg d "$dev" \
	'.spaces[] | select(.device == $d) | "\(.device)/\(.memory_kind): \(.bytes_in_use) bytes in use"'
