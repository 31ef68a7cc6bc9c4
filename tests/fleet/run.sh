#!/usr/bin/env bash
# tests/fleet/run.sh - the fleet on three test hosts: network namespaces
# tsf-h1..tsf-h3, each with one veth into a bridge that lives in a fourth
# namespace (tsf-hub), addresses 10.231.0.1-3/24, one tstaged in each
# (UCX_TLS=tcp, so the fleet's bytes cross the links). Nothing here touches
# the machine's own network: every interface, address and route is inside
# the namespaces, and every one of them is removed on exit.
#
# Checks, each bounded in time:
#   view       every node lists all three, reachable, each peer's devices
#              with its own host;
#   link down  a host's link cut (ip link set down) is unreachable from the
#              others within seconds while /v1/fleet and /livez answer at
#              once; back when the link is up again;
#   restart    a peer SIGKILLed is CONNECT_FAILED, then reachable again when
#              started anew at the same address;
#   dns        --peers-dns over the namespace's hosts file
#              (/etc/netns/NAME/hosts): the peers follow the name's records,
#              and a record removed leaves the list at the next resolution;
#   tickets    a ticket of the fleet port is issued only with the token;
#   copies     an array copied to another host over UCX into every memory
#              kind arrives byte for byte, the copies over one endpoint that
#              the sender keeps; a small array goes with its receive
#              request; a :put moves it; the receives' staging is freed; the
#              destination killed mid-copy fails the operation, naming it,
#              and leaves the source's version; started again at its
#              address, it gets the next copy over a new endpoint;
#   broadcast  an array of one host to the two others along a chain, byte
#              for byte on both, each destination published, the source
#              and the first hop each counting one copy sent; one destination refusing, with partial_ok,
#              leaves the other's copy and names the refusing one;
#   link cut   a destination's link cut mid-copy ends the copy
#              DEADLINE_EXCEEDED naming it after --fleet-timeout, the source
#              answering throughout; with the link back, copies go again;
#   chain      tests/fleet/chain.sh (three hosts of its own): a chain
#              byte for byte, its last hop refusing before any byte moves,
#              its middle killed mid-broadcast;
#   sender     tests/fleet/sender_killed.sh (two hosts of its own): a copy's
#   killed     sender SIGKILLed mid-copy, three times over; the receiving
#              daemon keeps serving, ends the receive UNAVAILABLE naming the
#              sender, and holds nothing of it after;
#   stop       each suite's daemons still running stopped with SIGTERM at
#              its end: each exits 0, and no daemon's log holds a
#              sanitizer's report (a sanitized build: CI runs the suite on
#              its ASan+UBSan and ThreadSanitizer daemons too; LeakSanitizer
#              reads what a daemon holds at that exit).
#
# Needs root (ip netns, tc) and curl, jq. Without them the suite says so and
# exits 0, except under CI=true, where it must run. Usage:
#   tests/fleet/run.sh [TSTAGED]   (default $TSTAGED, then build/tstaged)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${1:-${TSTAGED:-build/tstaged}}")
pfx=tsf
subnet=10.231.0
hosts=(h1 h2 h3)
token=fleet-netns-token-0123456789abcdef
port=8470
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tstage-fleet.XXXXXX")
failed=0
declare -A pid=()

. tests/fleet/netns.sh
suite=fleet
suite_require
trap netns_cleanup EXIT


netns_up || skip "ip netns add failed (no namespace support)"

# state FROM OF: OF as FROM's /v1/fleet lists it: "reachable", the error's
# reason, or "absent"
state() {
	api "$1" /v1/fleet | jq -r --arg h "$2" \
		'[.nodes[] | select(.host == $h and (.self | not))] |
		 if length == 0 then "absent" elif .[0].reachable then "reachable"
		 else .[0].error.reason end'
}
is_state() {
	[ "$(state "$1" "$2")" = "$3" ]
}
# fast HOST PATH: HOST answers PATH within 1 s (curl's whole time)
fast() {
	local t
	t=$(inns "$1" curl -s -o /dev/null -w '%{time_total}' --max-time 2 \
		-H "Authorization: Bearer $token" "http://$(addr "$1"):$port$2") || return 1
	awk -v t="$t" 'BEGIN { exit !(t < 1.0) }'
}

for h in "${hosts[@]}"; do
	start "$h" --peers "$(peers_of "$h")" || exit 1
done

# ---- view: every node sees all three, with each peer's devices --------------
view_ok() {
	local h o
	for h in "${hosts[@]}"; do
		for o in "${hosts[@]}"; do
			[ "$o" = "$h" ] && continue
			is_state "$h" "$o" reachable || return 1
		done
	done
}
if until_s 15 view_ok; then
	for h in "${hosts[@]}"; do
		got=$(api "$h" /v1/fleet | jq -c '[.nodes[] | [.host, (.devices | map(.host) | unique)]]')
		want=$(jq -nc --arg a "$h" '[$a] + ($ARGS.positional - [$a]) | map([., [.]])' \
			--args "${hosts[@]}")
		if [ "$got" = "$want" ]; then
			ok "view from $h: $got"
		else
			fail "view from $h: $got, want $want"
		fi
	done
else
	fail "the three nodes did not all see each other within 15 s"
	for h in "${hosts[@]}"; do
		api "$h" /v1/fleet | jq -c '[.nodes[] | [.host, .reachable, .error.reason]]'
	done
fi

# ---- link down: h3 cut off, seen unreachable, the others keep answering ----------
ip -n "$hub" link set h3-br down
# unreachable FROM OF: OF listed, with an error
unreachable() {
	local s
	s=$(state "$1" "$2")
	[ "$s" != reachable ] && [ "$s" != absent ]
}
if until_s 10 unreachable h1 h3; then
	ok "h3's link down: h1 lists it as $(state h1 h3)"
else
	fail "h3's link down: h1 still lists it as $(state h1 h3) after 10 s"
fi
if fast h1 /v1/fleet && fast h1 /livez && fast h2 /v1/fleet; then
	ok "with h3 cut off, /v1/fleet and /livez answer within 1 s"
else
	fail "with h3 cut off, an answer took 1 s or more"
fi
ip -n "$hub" link set h3-br up
if until_s 10 is_state h1 h3 reachable && until_s 10 is_state h3 h2 reachable; then
	ok "h3's link up again: reachable from h1, and h2 from h3"
else
	fail "h3's link up again: h1 lists it as $(state h1 h3), h3 lists h2 as $(state h3 h2)"
fi

# ---- restart: h2 killed, then started anew at the same address ------------------
kill -KILL "${pid[h2]}"
wait "${pid[h2]}" 2>/dev/null || true
unset "pid[h2]"
if until_s 10 is_state h1 h2 CONNECT_FAILED; then
	ok "h2 killed: CONNECT_FAILED from h1"
else
	fail "h2 killed: h1 lists it as $(state h1 h2)"
fi
start h2 --peers "$(peers_of h2)"
if until_s 10 is_state h1 h2 reachable && until_s 10 is_state h2 h3 reachable; then
	ok "h2 restarted at its address: reachable from h1, and it sees h3"
else
	fail "h2 restarted: h1 lists it as $(state h1 h2), h2 lists h3 as $(state h2 h3)"
fi

# ---- dns: h1 again, its peers from fleet.test's records ---------------------
kill -KILL "${pid[h1]}"
wait "${pid[h1]}" 2>/dev/null || true
unset "pid[h1]"
hostsf=/etc/netns/$(ns h1)/hosts
# rewritten in place (same file): the bind mount of a running daemon's
# namespace sees the new records
printf '127.0.0.1 localhost\n%s fleet.test\n%s fleet.test\n%s fleet.test\n' \
	"$(addr h1)" "$(addr h2)" "$(addr h3)" >"$hostsf"
start h1 --peers-dns fleet.test
urls() {
	api h1 /v1/fleet | jq -r '[.nodes[] | select(.self | not) | .url] | join(",")'
}
want_urls="http://$(addr h2):$port,http://$(addr h3):$port"
if until_s 15 is_state h1 h2 reachable && until_s 5 is_state h1 h3 reachable &&
	[ "$(urls)" = "$want_urls" ]; then
	ok "--peers-dns: h2 and h3 from fleet.test's records, h1's own address left out"
else
	fail "--peers-dns: h1 lists $(urls), want $want_urls"
fi
printf '127.0.0.1 localhost\n%s fleet.test\n%s fleet.test\n' "$(addr h1)" "$(addr h2)" \
	>"$hostsf"
if until_s 25 is_state h1 h3 absent; then
	ok "--peers-dns: h3's record removed, h3 left the list ($(urls))"
else
	fail "--peers-dns: h3's record removed 25 s ago, h1 still lists $(urls)"
fi

# ---- tickets: the fleet port's tickets need the token ------------------------
code=$(inns h2 curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST \
	"http://$(addr h2):$port/v1/fleet:ticket")
body=$(api h2 /v1/fleet:ticket -X POST)
if [ "$code" = 401 ] && [ "$(jq -r '.ticket | length' <<<"$body")" = 64 ]; then
	ok "a fleet ticket: 401 without the token, 64 hex digits with it"
else
	fail "fleet tickets: $code without the token; with it: $body"
fi

# ---- copies: an array of h1's to h2 and h3 over UCX, across the links -------------
# h1 was restarted with --peers-dns, now naming h2 only; h2 and h3 name everyone
head -c $((8 << 20)) /dev/urandom >"$tmp/x.raw"
want_sum=$(sha256sum <"$tmp/x.raw" | cut -d' ' -f1)
up=$(api h2 '/v1/arrays/x?dtype=uint8&shape=8388608&memory_kind=pinned_host' -X PUT \
	--data-binary @"$tmp/x.raw" -o /dev/null -w '%{http_code}')
[ "$up" = 201 ] || fail "upload of x to h2: $up"
accepted() {
	api "$1" /metrics | awk '/^tstage_fleet_ucx_connections_total\{result="accepted"\}/ { print $2 }'
}
acc0=$(accepted h3)
for kind in device pinned_host unpinned_host; do
	res=$(api h2 '/v1/arrays/x:copy?wait=true' -X POST --max-time 60 \
		-d "{\"out\": \"x-$kind\", \"host\": \"h3\", \"device\": \"sim:0\", \"memory_kind\": \"$kind\"}")
	got=$(api h3 "/v1/arrays/x-$kind/data" | sha256sum | cut -d' ' -f1)
	placed=$(api h3 "/v1/arrays/x-$kind" | jq -r '[.sharding.device // .device, .sharding.memory_kind // .memory_kind] | join("/")')
	if [ "$got" = "$want_sum" ] && [ "$placed" = "sim:0/$kind" ]; then
		ok "copy h2 -> h3 as sim:0/$kind: 8 MiB byte for byte across the link"
	else
		fail "copy h2 -> h3 as $kind: $(jq -c '.error // .done' <<<"$res" 2>/dev/null), placed $placed, sha $got"
	fi
done
# the three copies went over one endpoint, kept by h2 between them
acc1=$(accepted h3)
if [ $(( ${acc1%.*} - ${acc0%.*} )) = 1 ]; then
	ok "three copies h2 -> h3 over one endpoint (h3 admitted 1)"
else
	fail "three copies h2 -> h3: h3 admitted $acc0 -> $acc1 endpoints, want one more"
fi
# a small array goes with its receive request: byte for byte, no endpoint
head -c 3000 /dev/urandom >"$tmp/s.raw"
api h2 '/v1/arrays/s?dtype=uint8&shape=3000&memory_kind=pinned_host' -X PUT \
	--data-binary @"$tmp/s.raw" -o /dev/null
res=$(api h2 '/v1/arrays/s:copy?wait=true' -X POST --max-time 60 \
	-d '{"out": "s", "host": "h3", "memory_kind": "pinned_host"}')
got=$(api h3 /v1/arrays/s/data | sha256sum | cut -d' ' -f1)
acc2=$(accepted h3)
if [ "$got" = "$(sha256sum <"$tmp/s.raw" | cut -d' ' -f1)" ] && [ "$acc2" = "$acc1" ] &&
	grep -q 'fleet receive rcv-[0-9a-f]* of array .s. (3000 bytes) came with its request' "$tmp/h3.log"; then
	ok "a 3000-byte copy h2 -> h3 came with its receive request, byte for byte"
else
	fail "small copy h2 -> h3: $(jq -c '.error // .host' <<<"$res" 2>/dev/null), sha $got, endpoints $acc1 -> $acc2"
fi
# a :put moves it: there once, gone here
res=$(api h2 '/v1/arrays/x:put?wait=true' -X POST --max-time 60 \
	-d '{"host": "h1", "device": "sim:0", "memory_kind": "pinned_host"}')
got=$(api h1 /v1/arrays/x/data | sha256sum | cut -d' ' -f1)
gone=$(inns h2 curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" \
	"http://$(addr h2):$port/v1/arrays/x")
if [ "$got" = "$want_sum" ] && [ "$gone" = 404 ]; then
	ok ":put h2 -> h1: the array arrived whole and left h2"
else
	fail ":put h2 -> h1: sha $got there, $gone here ($(jq -c '.error // .done' <<<"$res" 2>/dev/null))"
fi
# nothing of the receives stays on h3: its unpinned_host pool holds the one
# array copied there, no staging
staged=$(inns h3 curl -s "http://$(addr h3):$port/metrics" |
	awk '/^tstage_pool_in_use_bytes\{.*pool="host\/unpinned_host"/ { print $2 }')
if [ "${staged%.*}" = $((8 << 20)) ]; then
	ok "h3's unpinned_host pool holds exactly the array copied there (staging freed)"
else
	fail "h3's unpinned_host pool holds $staged bytes, want $((8 << 20))"
fi
# ---- broadcast: one array of h3's to h1 and h2 at once, across the links ------
head -c $((16 << 20)) /dev/urandom >"$tmp/b.raw"
b_sum=$(sha256sum <"$tmp/b.raw" | cut -d' ' -f1)
api h3 '/v1/arrays/b?dtype=uint8&shape=16777216&memory_kind=pinned_host' -X PUT \
	--data-binary @"$tmp/b.raw" -o /dev/null
sent() {
	api "$1" /metrics | awk '/^tstage_fleet_transfer_bytes_total\{direction="sent"\}/ { print $2 }'
}
sent0=$(sent h3)
fwd0=$(sent h1)
res=$(api h3 '/v1/arrays/b:copy?wait=true' -X POST --max-time 60 \
	-d '{"out": "b", "hosts": ["h1", "h2"], "device": "sim:0", "memory_kind": "pinned_host"}')
sums=$(for h in h1 h2; do api "$h" /v1/arrays/b/data | sha256sum | cut -d' ' -f1; done | sort -u)
states=$(jq -c '[.destinations[] | [.host, .state]]' <<<"$res" 2>/dev/null || echo "$res")
sent1=$(sent h3)
fwd1=$(sent h1)
# a chain: h3 sends to h1 only, h1 forwards to h2
if [ "$sums" = "$b_sum" ] && [ "$states" = '[["h1","published"],["h2","published"]]' ] &&
	[ $(( ${sent1%.*} - ${sent0%.*} )) = $((16 << 20)) ] &&
	[ $(( ${fwd1%.*} - ${fwd0%.*} )) = $((16 << 20)) ]; then
	ok "broadcast h3 -> h1 -> h2: 16 MiB byte for byte on both, $states, 16 MiB sent by h3 and forwarded by h1"
else
	fail "broadcast h3 -> h1 -> h2: $states, sums $sums, sent $sent0 -> $sent1, forwarded $fwd0 -> $fwd1"
fi
# one destination refuses ("b" exists on h2 now): with partial_ok h1 gets it
api h1 /v1/arrays/b -X DELETE -o /dev/null
res=$(api h3 '/v1/arrays/b:copy?wait=true' -X POST --max-time 60 \
	-d '{"out": "b", "hosts": ["h1", "h2"], "partial_ok": true}')
got=$(api h1 /v1/arrays/b/data | sha256sum | cut -d' ' -f1)
if [ "$(jq -c .failed_hosts <<<"$res" 2>/dev/null)" = '["h2"]' ] && [ "$got" = "$b_sum" ]; then
	ok "broadcast with partial_ok, h2 refusing: h1 has it, failed_hosts [\"h2\"]"
else
	fail "broadcast with partial_ok: $res; h1's sha $got"
fi

# ---- link cut mid-copy: h3 again with --fleet-timeout 3; h1's link cut while
# h3 writes to it ends the copy DEADLINE_EXCEEDED naming h1, within bounds ----
kill -KILL "${pid[h3]}"
wait "${pid[h3]}" 2>/dev/null || true
unset "pid[h3]"
start h3 --peers "$(peers_of h3)" --fleet-timeout 3
until_s 15 is_state h3 h1 reachable || fail "h3 restarted: h1 is $(state h3 h1)"
api h3 '/v1/arrays/cut?dtype=uint8&shape=67108864&memory_kind=pinned_host' -X PUT \
	--data-binary @<(head -c $((64 << 20)) /dev/urandom) -o /dev/null
ip netns exec "$(ns h3)" tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 400ms
op=$(api h3 '/v1/arrays/cut:copy' -X POST \
	-d '{"out": "cut", "host": "h1", "memory_kind": "unpinned_host"}' | jq -r .name)
sending() {
	[ "$(api h3 "/v1/$op" | jq -r '.metadata.progress.bytes_done // 0')" -gt 0 ]
}
until_s 10 sending || true
ip -n "$hub" link set h1-br down
t0=$(date +%s)
op_over() {
	[ "$(api h3 "/v1/$op" | jq -r .done)" = true ]
}
if until_s 30 op_over; then
	took=$(( $(date +%s) - t0 ))
	state=$(api h3 "/v1/$op" | jq -r '[.metadata.state, .error.status, .error.message] | join(": ")')
	if [[ $state == FAILED:\ DEADLINE_EXCEEDED:*h1*--fleet-timeout* ]] && fast h3 /livez; then
		ok "h1's link cut mid-copy: after ${took} s, $state; h3 keeps answering"
	else
		fail "h1's link cut mid-copy: $state after ${took} s (want DEADLINE_EXCEEDED naming h1)"
	fi
else
	fail "h1's link cut mid-copy: $op not done 30 s after the cut"
fi
ip netns exec "$(ns h3)" tc qdisc del dev eth0 root 2>/dev/null || true
ip -n "$hub" link set h1-br up
# the link back, h3 copies to h1 again
until_s 15 is_state h3 h1 reachable || true
res=$(api h3 '/v1/arrays/cut:copy?wait=true' -X POST --max-time 60 \
	-d '{"out": "cut2", "host": "h1", "memory_kind": "unpinned_host"}')
if [ "$(jq -r .host <<<"$res" 2>/dev/null)" = h1 ]; then
	ok "h1's link up again: h3 copies to it"
else
	fail "h1's link up again: the copy to it answered $res"
fi

# the destination killed mid-copy: the operation fails naming it, the
# source keeps its version
api h1 '/v1/arrays/big?dtype=uint8&shape=67108864&memory_kind=pinned_host' -X PUT \
	--data-binary @<(head -c $((64 << 20)) /dev/urandom) -o /dev/null
etag=$(api h1 /v1/arrays/big | jq -r .etag)
# h1's link slowed to 100 Mbit/s (tc tbf in its namespace): 64 MiB take
# about five seconds, so the kill lands mid-copy
ip netns exec "$(ns h1)" tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 400ms
# h1's link was cut just before: its poller must see h2 again first
seen_reachable() { [ "$(state "$1" "$2")" = reachable ]; }
until_s 15 seen_reachable h1 h2 || true
op=$(api h1 '/v1/arrays/big:copy' -X POST \
	-d '{"out": "big", "host": "h2", "memory_kind": "unpinned_host"}' | jq -r .name)
copying() {
	[ "$(api h1 "/v1/$op" | jq -r '.metadata.progress.bytes_done // 0')" -gt 0 ]
}
until_s 10 copying || true
kill -KILL "${pid[h2]}"
wait "${pid[h2]}" 2>/dev/null || true
unset "pid[h2]"
op_done() {
	[ "$(api h1 "/v1/$op" | jq -r .done)" = true ]
}
if until_s 90 op_done; then
	ip netns exec "$(ns h1)" tc qdisc del dev eth0 root 2>/dev/null || true
	state=$(api h1 "/v1/$op" | jq -r '[.metadata.state, .error.message] | join(": ")')
	if [[ $state == FAILED:*h2* ]] && [ "$(api h1 /v1/arrays/big | jq -r .etag)" = "$etag" ]; then
		ok "destination killed mid-copy: $state; the source's version unchanged"
	else
		fail "destination killed mid-copy: $state (want FAILED naming h2, source ETag kept)"
	fi
else
	fail "destination killed mid-copy: $op not done after 90 s"
fi
# h2 started again at its address: h1 drops the endpoint it kept there and
# copies over a new one
start h2 --peers "$(peers_of h2)"
until_s 15 seen_reachable h1 h2 || true
# small copies at once: h1 kept its HTTP connection to the old h2 (the
# receive of the copy above), which the new one never accepted; each copy
# goes over a new connection, none fails on the dead one
api h1 '/v1/arrays/s2?dtype=uint8&shape=3000&memory_kind=pinned_host' -X PUT \
	--data-binary @"$tmp/s.raw" -o /dev/null
small_ok=0
for k in 1 2 3; do
	res=$(api h1 '/v1/arrays/s2:copy?wait=true' -X POST --max-time 60 \
		-d "{\"out\": \"s2-$k\", \"host\": \"h2\", \"memory_kind\": \"pinned_host\"}")
	got=$(api h2 "/v1/arrays/s2-$k/data" | sha256sum | cut -d' ' -f1)
	[ "$got" = "$(sha256sum <"$tmp/s.raw" | cut -d' ' -f1)" ] && small_ok=$((small_ok + 1))
done
if [ "$small_ok" = 3 ]; then
	ok "h2 restarted at its address: three small copies from h1 at once, byte for byte"
else
	fail "h2 restarted: $small_ok of 3 small copies from h1 arrived; last: $(jq -c '.error // .host' <<<"$res" 2>/dev/null)"
fi
api h1 '/v1/arrays/again?dtype=uint8&shape=8388608&memory_kind=pinned_host' -X PUT \
	--data-binary @"$tmp/x.raw" -o /dev/null
res=$(api h1 '/v1/arrays/again:copy?wait=true' -X POST --max-time 60 \
	-d '{"out": "again", "host": "h2", "memory_kind": "unpinned_host"}')
got=$(api h2 /v1/arrays/again/data | sha256sum | cut -d' ' -f1)
if [ "$got" = "$want_sum" ]; then
	ok "h2 restarted at its address: h1 copies to it again byte for byte"
else
	fail "h2 restarted: the copy from h1 answered $(jq -c '.error // .host' <<<"$res" 2>/dev/null), sha $got"
fi

# ---- a chained broadcast: its own three hosts (tsc-*, 10.234.0.0/24) --------
if tests/fleet/chain.sh "$bin"; then
	ok "chained broadcast (tests/fleet/chain.sh)"
else
	fail "chained broadcast (tests/fleet/chain.sh)"
fi

# ---- sender killed mid-copy: its own two hosts (tsk-*, 10.232.0.0/24) -------
if tests/fleet/sender_killed.sh "$bin"; then
	ok "sender killed mid-copy (tests/fleet/sender_killed.sh)"
else
	fail "sender killed mid-copy (tests/fleet/sender_killed.sh)"
fi
suite_end
