#!/usr/bin/env bash
# tests/fleet/sender_killed.sh - a copy's sender SIGKILLed mid-copy, a few
# times over: two test hosts in network namespaces (tsk-h1, tsk-h2, veths on
# a bridge in tsk-hub, 10.232.0.1-2/24), one tstaged in each (UCX_TLS=tcp).
# h1 copies 64 MiB to h2 over a link slowed to 100 Mbit/s and is killed once
# bytes have moved. Each time the receiving daemon h2 must
#   - keep running and answer at once;
#   - end the receive with UNAVAILABLE naming the peer: its log says so, and
#     a commit of that receive answers 503 UNAVAILABLE PEER_FAILED naming h1;
#   - give everything back: no receive open, no staging bytes, every pool's
#     bytes in use as before the copy (the destination's reservation too),
#     no endpoint open on its fleet port (all from /metrics).
# Then h1, started anew, copies to h2 whole.
#
# Needs root (ip netns, tc), curl and jq; without them it says so and exits
# 0, except under CI=true. Usage: tests/fleet/sender_killed.sh [TSTAGED]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${1:-${TSTAGED:-build/tstaged}}")
pfx=tsk
subnet=10.232.0
hosts=(h1 h2)
token=fleet-kill-token-0123456789abcdef0
port=8480
rounds=${ROUNDS:-3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tstage-fleet-kill.XXXXXX")
failed=0
declare -A pid=()

. tests/fleet/netns.sh
suite=fleet-kill
suite_require
trap netns_cleanup EXIT

netns_up || skip "ip netns add failed (no namespace support)"

reachable() {
	[ "$(api "$1" /v1/fleet | jq -r --arg h "$2" \
		'[.nodes[] | select(.host == $h)][0].reachable')" = true ]
}
# metric HOST NAME: the value of an unlabelled gauge
# pools HOST: every pool's bytes in use, one "pool value" a line
alive() {
	kill -0 "${pid[$1]}" 2>/dev/null &&
		inns "$1" curl -s -o /dev/null --max-time 1 "http://$(addr "$1"):$port/livez"
}

start h1 --peers "$(peers_of h1)"
start h2 --peers "$(peers_of h2)"
until_s 15 reachable h1 h2 || fail "h1 does not see h2 within 15 s"
before=$(pools h2)
head -c $((64 << 20)) /dev/urandom >"$tmp/big.raw"
for ((r = 1; r <= rounds; r++)); do
	up=$(api h1 '/v1/arrays/big?dtype=uint8&shape=67108864&memory_kind=pinned_host' -X PUT \
		--max-time 30 --data-binary @"$tmp/big.raw" -o /dev/null -w '%{http_code}')
	[ "$up" = 201 ] || fail "round $r: upload to h1: $up"
	# 100 Mbit/s out of h1: 64 MiB take about five seconds
	inns h1 tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 400ms
	op=$(api h1 '/v1/arrays/big:copy' -X POST \
		-d '{"out": "big", "host": "h2", "device": "sim:0", "memory_kind": "pinned_host"}' |
		jq -r .name)
	moved() {
		[ "$(api h1 "/v1/$op" | jq -r '.metadata.progress.bytes_done // 0')" -gt $((4 << 20)) ]
	}
	until_s 15 moved || fail "round $r: no bytes moved in 15 s"
	kill -KILL "${pid[h1]}"
	wait "${pid[h1]}" 2>/dev/null || true
	unset "pid[h1]"
	inns h1 tc qdisc del dev eth0 root 2>/dev/null || true
	rid=$(grep -o 'fleet receive rcv-[0-9a-f]* of array .big. ([0-9]* bytes) open' "$tmp/h2.log" |
		tail -1 | awk '{ print $3 }')
	receive_failed() {
		grep -q "fleet receive $rid .*failed.*UNAVAILABLE.*h1" "$tmp/h2.log"
	}
	released() {
		[ "$(metric h2 tstage_fleet_receives_open)" = 0 ] &&
			[ "$(metric h2 tstage_fleet_staging_bytes)" = 0 ] &&
			[ "$(metric h2 tstage_fleet_ucx_endpoints)" = 0 ] &&
			[ "$(pools h2)" = "$before" ]
	}
	if ! alive h2; then
		fail "round $r: h2 died when its sender was killed: $(tail -3 "$tmp/h2.log" | cut -c1-300)"
		break
	fi
	if [ -n "$rid" ] && until_s 15 receive_failed; then
		ok "round $r: h2 ended receive $rid: $(grep -o "fleet receive $rid .*failed[^\"]*" "$tmp/h2.log" | head -1 | cut -c1-200)"
	else
		fail "round $r: h2 did not end receive '$rid' UNAVAILABLE naming h1 within 15 s"
	fi
	res=$(api h2 "/v1/fleet/receives/$rid:commit" -X POST -w ' %{http_code}')
	if [[ $res == *' 503' ]] && [ "$(jq -r ".error.details[0].reason" <<<"${res% *}")" = PEER_FAILED ] &&
		[[ "$(jq -r .error.message <<<"${res% *}")" == *h1* ]]; then
		ok "round $r: its commit answers 503 $(jq -r '.error.message' <<<"${res% *}" | cut -c1-160)"
	else
		fail "round $r: its commit answered $res"
	fi
	if until_s 10 released; then
		ok "round $r: nothing held on h2: no receive, no staging, no endpoint, pools as before"
	else
		fail "round $r: h2 holds receives $(metric h2 tstage_fleet_receives_open), staging $(metric h2 tstage_fleet_staging_bytes), endpoints $(metric h2 tstage_fleet_ucx_endpoints); pools $(pools h2 | tr '\n' ' ') (before: $(tr '\n' ' ' <<<"$before"))"
	fi
	[ "$(api h2 /v1/arrays/big -o /dev/null -w '%{http_code}')" = 404 ] ||
		fail "round $r: a partial 'big' was published on h2"
	start h1 --peers "$(peers_of h1)" || break
	until_s 15 reachable h1 h2 || fail "round $r: h1 restarted does not see h2"
done
# h2 keeps serving: a whole copy from the restarted h1
if [ -n "${pid[h1]:-}" ]; then
	api h1 '/v1/arrays/big?dtype=uint8&shape=67108864&memory_kind=pinned_host' -X PUT \
		--max-time 30 --data-binary @"$tmp/big.raw" -o /dev/null
	res=$(api h1 '/v1/arrays/big:copy?wait=true' -X POST --max-time 60 \
		-d '{"out": "big", "host": "h2", "device": "sim:0", "memory_kind": "pinned_host"}')
	got=$(api h2 /v1/arrays/big/data --max-time 30 | sha256sum | cut -d' ' -f1)
	if [ "$got" = "$(sha256sum <"$tmp/big.raw" | cut -d' ' -f1)" ]; then
		ok "after $rounds kills, h1 copies 64 MiB to h2 byte for byte"
	else
		fail "after the kills, a copy to h2: $(jq -c '.error // .done' <<<"$res" 2>/dev/null)"
	fi
fi
suite_end
