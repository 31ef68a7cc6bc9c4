#!/usr/bin/env bash
# examples/dashboard_poll.sh - what a dashboard polls: every (device, memory
# kind) space with used, peak and limit, the operations in flight, and the
# transfer counters, every INTERVAL seconds, COUNT times (0: forever).
# Needs curl and jq.
#
#   TSTAGE_URL=http://127.0.0.1:8470 INTERVAL=1 COUNT=0 examples/dashboard_poll.sh
set -euo pipefail
url=${TSTAGE_URL:-http://127.0.0.1:8470}
interval=${INTERVAL:-1} count=${COUNT:-0}
auth=()
[ -n "${TSTAGE_TOKEN_FILE:-}" ] && auth=(-H "Authorization: Bearer $(cat "$TSTAGE_TOKEN_FILE")")
api() { curl -fsS "${auth[@]}" "$@"; }

snap=$(mktemp)
trap 'rm -f "$snap"' EXIT
n=0
while :; do
	printf '%s\n' "---- $(date -u +%H:%M:%S)"
	api "$url/v1/memory" >"$snap"
	jq -r '
		def mib: . / 1048576 | . * 10 | round / 10;
		.spaces[] | "\(.device)/\(.memory_kind)\t\(.bytes_in_use | mib) MiB used\t" +
		            "\(.peak_bytes_in_use | mib) peak\t\(.bytes_limit | mib) limit\t" +
		            "\(if .bytes_limit > 0 then (100 * .bytes_in_use / .bytes_limit | floor) else 0 end)%"' \
		"$snap" | column -t -s $'\t'
	jq -r '
		def mib: . / 1048576 | . * 10 | round / 10;
		"transfers: \(.transfers.bytes // {} | to_entries | map(select(.value > 0)) |
		               map("\(.key) \(.value | mib) MiB") | join(", "))",
		"implicit transfers: \(.transfers.implicit_transfer_bytes // 0 | mib) MiB"' "$snap"
	api "$url/v1/operations" | jq -r '
		.operations[] | (.metadata // .) as $m | select(.done | not) |
		"op \(.name) \($m.kind) \($m.target // "") \($m.state) " +
		"\($m.progress | to_entries | map("\(.key)=\(.value)") | join(" "))"'
	n=$((n + 1))
	[ "$count" -gt 0 ] && [ "$n" -ge "$count" ] && break
	sleep "$interval"
done
