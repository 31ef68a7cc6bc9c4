#!/usr/bin/env bash
# tests/fleet/chain.sh - a broadcast along a chain: three test hosts in
# network namespaces (tsc-h1..tsc-h3, veths on a bridge in tsc-hub,
# 10.234.0.1-3/24), one tstaged in each (UCX_TLS=tcp). Checks:
#   chain      h1's array to ["h2", "h3"]: h1 sends to h2 only, h2 forwards
#              to h3 as the chunks land; byte for byte on both, both
#              published, h1 and h2 each sent the array once;
#   refused    the last hop refusing (h3's device memory too small: 429)
#              fails the broadcast RESOURCE_EXHAUSTED naming h3 before any
#              byte moves: nothing sent, h2 never asked;
#   progress   with h1's link slowed, h3's bytes show in the operation
#              while h1 is still sending to h2;
#   middle     h2 SIGKILLed mid-broadcast (h1's link slowed): the operation
#              fails UNAVAILABLE naming h2, h3 fails CHAIN_BROKEN naming
#              h2; nothing published on h3, which gives back everything
#              (no receive, no staging, no endpoint, pools as before) and
#              keeps serving.
#
# Needs root (ip netns, tc), curl and jq; without them it says so and exits
# 0, except under CI=true. Usage: tests/fleet/chain.sh [TSTAGED]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${1:-${TSTAGED:-build/tstaged}}")
pfx=tsc
subnet=10.234.0
hosts=(h1 h2 h3)
token=fleet-chain-token-0123456789abcdef
port=8500
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tstage-fleet-chain.XXXXXX")
failed=0
declare -A pid=()

. tests/fleet/netns.sh
suite=fleet-chain
suite_require
trap netns_cleanup EXIT

netns_up || skip "ip netns add failed (no namespace support)"

seen() { # every host sees every other reachable
	local h o
	for h in "${hosts[@]}"; do
		for o in "${hosts[@]}"; do
			[ "$o" = "$h" ] && continue
			[ "$(api "$h" /v1/fleet | jq -r --arg o "$o" \
				'[.nodes[] | select(.host == $o)][0].reachable')" = true ] || return 1
		done
	done
}
sent() {
	api "$1" /metrics | awk '/^tstage_fleet_transfer_bytes_total\{direction="sent"\}/ { print $2 }'
}

start h1 --peers "$(peers_of h1)"
start h2 --peers "$(peers_of h2)"
start h3 --peers "$(peers_of h3)" --sim-device-memory 16MiB
until_s 15 seen || fail "the three hosts do not see each other within 15 s"

# ---- chain: h1 -> h2 -> h3, byte for byte ----------------------------------
head -c $((32 << 20)) /dev/urandom >"$tmp/c.raw"
c_sum=$(sha256sum <"$tmp/c.raw" | cut -d' ' -f1)
api h1 '/v1/arrays/c?dtype=uint8&shape=33554432&memory_kind=pinned_host' -X PUT \
	--max-time 30 --data-binary @"$tmp/c.raw" -o /dev/null
s1=$(sent h1)
s2=$(sent h2)
res=$(api h1 '/v1/arrays/c:copy?wait=true' -X POST --max-time 60 \
	-d '{"out": "c", "hosts": ["h2", "h3"], "memory_kind": "pinned_host"}')
sums=$(for h in h2 h3; do api "$h" /v1/arrays/c/data --max-time 30 | sha256sum | cut -d' ' -f1; done | sort -u)
states=$(jq -c '[.destinations[] | [.host, .state]]' <<<"$res" 2>/dev/null || echo "$res")
d1=$(( ${s1%.*} - 0 )); d1=$(( $(sent h1 | cut -d. -f1) - d1 ))
d2=$(( $(sent h2 | cut -d. -f1) - ${s2%.*} ))
if [ "$sums" = "$c_sum" ] && [ "$states" = '[["h2","published"],["h3","published"]]' ] &&
	[ "$d1" = $((32 << 20)) ] && [ "$d2" = $((32 << 20)) ] &&
	grep -q "array 'c' forwarded to peer 'h3'" "$tmp/h2.log"; then
	ok "chain h1 -> h2 -> h3: 32 MiB byte for byte on both, $states; h1 sent $d1, h2 forwarded $d2"
else
	fail "chain h1 -> h2 -> h3: $states, sums $sums (want $c_sum), h1 sent $d1, h2 sent $d2: $(jq -c .error <<<"$res" 2>/dev/null)"
fi
# a receive's state: 404 once committed
code=$(api h3 /v1/fleet/receives/rcv-00000000000000000000000000000000 -o /dev/null -w '%{http_code}')
[ "$code" = 404 ] || fail "the state of an unknown receive answered $code, want 404"

# ---- refused: the last hop out of device memory, before any byte moves -----
api h2 /v1/arrays/c -X DELETE -o /dev/null
s1=$(sent h1)
opened=$(grep -c "of array 'c2'" "$tmp/h2.log" || true)
res=$(api h1 '/v1/arrays/c:copy?wait=true' -X POST --max-time 60 \
	-d '{"out": "c2", "hosts": ["h2", "h3"], "device": "sim:0", "memory_kind": "device"}')
st=$(jq -r '[.error.status, .error.message] | join(": ")' <<<"$res" 2>/dev/null)
if [[ $st == RESOURCE_EXHAUSTED:*h3* ]] && [ "$(sent h1)" = "$s1" ] &&
	[ "$(grep -c "of array 'c2'" "$tmp/h2.log" || true)" = "$opened" ] &&
	[ "$(api h2 /v1/arrays/c2 -o /dev/null -w '%{http_code}')" = 404 ] &&
	[ "$(metric h3 tstage_fleet_receives_open)" = 0 ]; then
	ok "the last hop refusing: $(cut -c1-160 <<<"$st"); no byte sent, h2 never asked"
else
	fail "the last hop refusing: $st; h1 sent $s1 -> $(sent h1); h2's log: $(grep "of array 'c2'" "$tmp/h2.log" | tail -2)"
fi

# ---- progress: the last hop's bytes show while the source still sends -------
# h1's link at 200 Mbit/s: 64 MiB (16 chunks, 4 in flight) take at least
# 2.7 s to leave it
# slow_broadcast NAME RATE KIND: 64 MiB of random bytes uploaded to h1 as
# NAME, h1's link limited to RATE, and a broadcast of NAME to h2 and h3
# (memory kind KIND there) started: its operation's name into $op
slow_broadcast() {
	head -c $((64 << 20)) /dev/urandom >"$tmp/$1.raw"
	api h1 "/v1/arrays/$1?dtype=uint8&shape=67108864&memory_kind=pinned_host" -X PUT \
		--max-time 30 --data-binary @"$tmp/$1.raw" -o /dev/null
	inns h1 tc qdisc add dev eth0 root tbf rate "$2" burst 64kb latency 400ms
	op=$(api h1 "/v1/arrays/$1:copy" -X POST \
		-d "{\"out\": \"$1\", \"hosts\": [\"h2\", \"h3\"], \"memory_kind\": \"$3\"}" | jq -r .name)
}
slow_broadcast p 200mbit pinned_host
seen_mid=
for ((i = 0; i < 300; i++)); do
	o=$(api h1 "/v1/$op")
	[ "$(jq -r .done <<<"$o")" = true ] && break
	# h3 has bytes while h2, the chain's head, is still short of all of them
	if jq -e '[.metadata.destinations[] | {(.host): .bytes_done}] | add |
		.h3 > 0 and .h2 < 67108864' <<<"$o" >/dev/null 2>&1; then
		seen_mid=$(jq -c '[.metadata.destinations[] | [.host, .bytes_done]]' <<<"$o")
	fi
	sleep 0.05
done
inns h1 tc qdisc del dev eth0 root
p_done() { [ "$(api h1 "/v1/$op" | jq -r .done)" = true ]; }
until_s 60 p_done || true
state=$(api h1 "/v1/$op" | jq -r '.metadata.state')
if [ -n "$seen_mid" ] && [ "$state" = SUCCEEDED ]; then
	ok "progress: h3's bytes seen while h1 still sent to h2 ($seen_mid), then $state"
else
	fail "progress: h3's bytes never seen while h1 sent (state $state, last $(api h1 "/v1/$op" | jq -c .metadata.destinations))"
fi

# ---- middle killed: h2 dies mid-broadcast -----------------------------------
before=$(pools h3)
slow_broadcast m 100mbit unpinned_host
moved() {
	[ "$(api h1 "/v1/$op" | jq -r '.metadata.progress.bytes_done // 0')" -gt $((8 << 20)) ]
}
until_s 15 moved || fail "middle killed: no bytes moved in 15 s"
kill -KILL "${pid[h2]}"
wait "${pid[h2]}" 2>/dev/null || true
unset "pid[h2]"
op_done() { [ "$(api h1 "/v1/$op" | jq -r .done)" = true ]; }
if until_s 60 op_done; then
	state=$(api h1 "/v1/$op" | jq -r '[.metadata.state, .error.status, .error.message] | join(": ")')
	h3st=$(api h1 "/v1/$op" | jq -r '.metadata.destinations[] | select(.host == "h3") |
		[.state, .error.status, (.error.details[0].reason // ""), .error.message] | join(": ")')
	if [[ $state == FAILED:\ UNAVAILABLE:*h2* ]] && [[ $h3st == failed:\ UNAVAILABLE:\ CHAIN_BROKEN:*h2* ]]; then
		ok "middle killed: $(cut -c1-120 <<<"$state"); h3: $(cut -c1-120 <<<"$h3st")"
	else
		fail "middle killed: $state; h3: $h3st"
	fi
else
	fail "middle killed: $op not done 60 s after the kill"
fi
inns h1 tc qdisc del dev eth0 root 2>/dev/null || true
released() {
	[ "$(metric h3 tstage_fleet_receives_open)" = 0 ] &&
		[ "$(metric h3 tstage_fleet_staging_bytes)" = 0 ] &&
		[ "$(metric h3 tstage_fleet_ucx_endpoints)" = 0 ] &&
		[ "$(pools h3)" = "$before" ]
}
if until_s 15 released && [ "$(api h3 /v1/arrays/m -o /dev/null -w '%{http_code}')" = 404 ]; then
	ok "middle killed: nothing published on h3; no receive, staging or endpoint held, pools as before"
else
	fail "middle killed: h3 holds receives $(metric h3 tstage_fleet_receives_open), staging $(metric h3 tstage_fleet_staging_bytes), endpoints $(metric h3 tstage_fleet_ucx_endpoints), m: $(api h3 /v1/arrays/m -o /dev/null -w '%{http_code}'); pools $(pools h3 | tr '\n' ' ') (before $(tr '\n' ' ' <<<"$before"))"
fi
[ "$(metric h1 tstage_fleet_receives_open)" = 0 ] || fail "middle killed: h1 holds a receive"

suite_end
