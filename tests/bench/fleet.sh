#!/usr/bin/env bash
# tests/bench/fleet.sh - bench_fleet's measurements between network
# namespaces (tsb-h1..tsb-h3: veths on a bridge in tsb-hub, 10.233.0.1-3/24),
# everything over the same veth links with UCX_TLS=tcp:
#   copy     a pinned_host array of MB MiB on h1's tstaged copied to h2's
#            (POST :copy?wait=true, the whole operation): the first, into
#            pages h2 never had, then best of 3 into its pool's kept ones;
#   perftest ucx_perftest -t ucp_am_bw (the copy's active messages) of the
#            same bytes in 4 MiB messages (the copy's chunk), h1 -> h2;
#   http     h2 downloading the array from h1 (GET .../data) into memory by
#            FETCH --fetch (bench_fleet: libcurl, one kept connection, one
#            buffer touched before), best of 3; and by the curl tool into
#            /dev/null, best of 3;
#   bcast    the array copied to h2 and h3 at once ("hosts"), best of 3;
#   limited  on links of 1 Gbit/s each way (tc tbf), a copy of up to 128 MiB
#            to h2 and its broadcast to h2 and h3, best of 2 each;
#   small    a 4 KiB array copied to h2, best of 10, one HTTP request from h1
#            to h2 (GET /livez), best of 10, and ucx_perftest -t ucp_am_lat
#            of 4 KiB messages (half a round trip).
# Prints "name value" lines on stdout: copy_bytes, copy_s, first_copy_s,
# perftest_bytes_s,
# http_bytes_s, curl_null_bytes_s, broadcast_s, limited_bytes, limited_copy_s,
# limited_broadcast_s, small_s, request_s, am_lat_s; or one line
# "skip WHY". Needs root (ip netns), curl, jq and
# ucx_perftest (ucx-utils). Usage: tests/bench/fleet.sh TSTAGED [MB [FETCH]]
# (FETCH: the bench_fleet binary, default build/bench/bench_fleet)
set -euo pipefail
bin=$(realpath "$1")
mb=${2:-1024}
fetch=$(realpath "${3:-build/bench/bench_fleet}")
pfx=tsb
subnet=10.233.0
hosts=(h1 h2 h3)
api_timeout=600
port=8490
ucxport=8495
token=fleet-bench-token-0123456789abcdef
# Idle pinned_host segments each daemon keeps for reuse (--pinned-host-keep):
# enough for the arrays of the broadcast, so that a receive lands in memory
# its pool pinned before, as on a node that receives arrays again and again
# (and as ucx_perftest's and curl's reused buffers do); the default keeps an
# eighth of the pinned budget, 768 MiB on a 24 GiB machine
keep=$((3 * mb + 64))MiB
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tstage-bench-fleet.XXXXXX")
declare -A pid=()

skip() {
	echo "skip $1"
	exit 0
}
[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces)"
for tool in ip curl jq ucx_perftest; do
	command -v "$tool" >/dev/null || skip "no $tool"
done

. "$(dirname "$0")/../fleet/netns.sh"
trap netns_cleanup EXIT
netns_up || skip "ip netns add failed"

for h in "${hosts[@]}"; do
	peers=$(for o in "${hosts[@]}"; do [ "$o" = "$h" ] || printf 'http://%s:%s,' "$(addr "$o")" "$port"; done)
	# ip netns exec execs the daemon: $! is its pid, which cleanup kills
	UCX_TLS=tcp ip netns exec "$(ns "$h")" "$bin" --bind "$(addr "$h")" --port "$port" --log-level warn \
		--token-file "$tmp/token" --host-name "$h" --sim-devices 1 \
		--peers "${peers%,}" --pinned-host-keep "$keep" >"$tmp/$h.log" 2>&1 &
	pid[$h]=$!
done
for h in "${hosts[@]}"; do
	for ((i = 0; i < 100; i++)); do
		inns "$h" curl -s -o /dev/null --max-time 1 "http://$(addr "$h"):$port/livez" && break
		sleep 0.1
	done
done
for ((i = 0; i < 100; i++)); do
	[ "$(api h1 /v1/fleet | jq -r '[.nodes[] | select(.host != "h1" and .reachable)] | length')" = 2 ] &&
		break
	sleep 0.2
done

# upload NAME BYTES: a pinned_host uint8 array of BYTES zeros on h1
upload() {
	local code
	truncate -s "$2" "$tmp/up.raw"
	code=$(api h1 "/v1/arrays/$1?dtype=uint8&shape=$2&memory_kind=pinned_host" -T "$tmp/up.raw" \
		-o /dev/null -w '%{http_code}')
	rm -f "$tmp/up.raw"
	[ "$code" = 201 ] || { echo "fleet bench: upload of $2 bytes to h1: $code" >&2; exit 1; }
}
# copy_s ARRAY OUT HOST...: seconds of one POST :copy?wait=true of h1's ARRAY
# as OUT to HOST ("host") or to every HOST ("hosts"), OUT deleted there first
copy_s() {
	local a=$1 out=$2 h to t n
	shift 2
	for h in "$@"; do
		api "$h" "/v1/arrays/$out" -X DELETE -o /dev/null
	done
	if [ $# -eq 1 ]; then
		to="\"host\": \"$1\""
	else
		to="\"hosts\": [$(printf '"%s",' "$@" | sed 's/,$//')]"
	fi
	t=$(api h1 "/v1/arrays/$a:copy?wait=true" -X POST -o "$tmp/res" -w '%{time_total}' \
		-d "{\"out\": \"$out\", $to, \"device\": \"sim:0\", \"memory_kind\": \"pinned_host\"}")
	if [ $# -eq 1 ]; then
		n=$(jq -r .host "$tmp/res" 2>/dev/null)
		[ "$n" = "$1" ]
	else
		n=$(jq -r '.destinations | length' "$tmp/res" 2>/dev/null)
		[ "$n" = $# ]
	fi || { echo "fleet bench: copy of $a to $*: $(head -c 300 "$tmp/res")" >&2; exit 1; }
	echo "$t"
}
# least A B: the smaller (A empty: B)
least() {
	awk -v a="${1:-1e9}" -v b="$2" 'BEGIN { print (b < a ? b : a) }'
}

bytes=$((mb << 20))
upload x "$bytes"

# the first copy lands in pages the receiving node has never had (fresh
# from the kernel: each faulted in and zeroed as the bytes arrive); the
# later ones in the pinned segments its pool kept
first_copy=$(copy_s x x h2)
best_copy=
for r in 1 2 3; do
	t=$(copy_s x x h2)
	best_copy=$(least "$best_copy" "$t")
done

# the same bytes to h2 and h3 at once (a broadcast), best of 3
best_bcast=
for r in 1 2 3; do
	t=$(copy_s x xb h2 h3)
	best_bcast=$(least "$best_bcast" "$t")
done
for h in h2 h3; do
	api "$h" /v1/arrays/xb -X DELETE -o /dev/null
done

# The same two measurements on links that each carry at most $link_rate
# either way (tc tbf on both ends of every host's veth, as a NIC limits its
# port), of a $lim_mb MiB array: on the links above, nothing but the two
# shared cores limits a copy, and a broadcast's three daemons do twice a
# copy's work on them whatever carries the bytes; here the links limit, as
# between nodes, and a chain sends each byte once on each link where
# sending from the source would put both destinations' bytes on its one
link_rate=1gbit
lim_mb=$((mb < 128 ? mb : 128))
lim_bytes=$((lim_mb << 20))
upload l "$lim_bytes"
for h in "${hosts[@]}"; do
	tc -n "$(ns "$h")" qdisc add dev eth0 root tbf rate "$link_rate" burst 256kb latency 100ms
	tc -n "$hub" qdisc add dev "$h-br" root tbf rate "$link_rate" burst 256kb latency 100ms
done
best_lcopy=
best_lbcast=
for r in 1 2; do
	t=$(copy_s l l h2)
	best_lcopy=$(least "$best_lcopy" "$t")
	t=$(copy_s l lb h2 h3)
	best_lbcast=$(least "$best_lbcast" "$t")
done
for h in "${hosts[@]}"; do
	tc -n "$(ns "$h")" qdisc del dev eth0 root
	tc -n "$hub" qdisc del dev "$h-br" root
	api "$h" /v1/arrays/lb -X DELETE -o /dev/null
done
api h1 /v1/arrays/l -X DELETE -o /dev/null
api h2 /v1/arrays/l -X DELETE -o /dev/null

# a 4 KiB array copied to h2, best of 10; and one HTTP request's time
# between the two (GET /livez from h1 to h2), best of 10
upload s 4096
best_small=
best_req=
for r in $(seq 10); do
	t=$(copy_s s s h2)
	best_small=$(least "$best_small" "$t")
	t=$(inns h1 curl -s -o /dev/null -w '%{time_total}' "http://$(addr h2):$port/livez")
	best_req=$(least "$best_req" "$t")
done

# ucx_perftest's 4 KiB active-message latency over the same link (its
# figure is half a round trip)
UCX_TLS=tcp ip netns exec "$(ns h2)" ucx_perftest -p "$ucxport" >"$tmp/lat-server.log" 2>&1 &
pid[pt]=$!
sleep 1
UCX_TLS=tcp inns h1 ucx_perftest "$(addr h2)" -p "$ucxport" -t ucp_am_lat -s 4096 -n 2000 -f \
	>"$tmp/lat.log" 2>&1 || { echo "fleet bench: ucx_perftest lat: $(tail -3 "$tmp/lat.log")" >&2; exit 1; }
wait "${pid[pt]}" 2>/dev/null || true
unset "pid[pt]"
# the final line: iterations, latency (usec) typical, average, overall, ...
lat_us=$(awk 'NF == 8 && $1 ~ /^[0-9]+$/ { v = $3 } END { print v }' "$tmp/lat.log")
[ -n "$lat_us" ] || { echo "fleet bench: no latency from ucx_perftest: $(tail -3 "$tmp/lat.log")" >&2; exit 1; }

UCX_TLS=tcp ip netns exec "$(ns h2)" ucx_perftest -p "$ucxport" >"$tmp/pt-server.log" 2>&1 &
pid[pt]=$!
sleep 1
msg=$((4 << 20))
n=$(( (bytes + msg - 1) / msg ))
UCX_TLS=tcp inns h1 ucx_perftest "$(addr h2)" -p "$ucxport" -t ucp_am_bw -s "$msg" -n "$n" -w 4 -f \
	>"$tmp/pt.log" 2>&1 || { echo "fleet bench: ucx_perftest: $(tail -3 "$tmp/pt.log")" >&2; exit 1; }
wait "${pid[pt]}" 2>/dev/null || true
unset "pid[pt]"
# the final line: iterations, overhead (50%, average, overall), bandwidth
# (MB/s: MiB) average and overall, message rate
pt_mibs=$(awk 'NF == 8 && $1 ~ /^[0-9]+$/ { v = $6 } END { print v }' "$tmp/pt.log")
[ -n "$pt_mibs" ] || { echo "fleet bench: no figure from ucx_perftest: $(tail -3 "$tmp/pt.log")" >&2; exit 1; }

best_http=$(inns h2 "$fetch" --fetch "http://$(addr h1):$port/v1/arrays/x/data" "$bytes" "$token" 3 |
	awk '$1 == "fetch_bytes_s" { print $2 }')
[ -n "$best_http" ] || { echo "fleet bench: the download into memory failed" >&2; exit 1; }
best_null=0
for r in 1 2 3; do
	s=$(inns h2 curl -s --max-time 600 -H "Authorization: Bearer $token" -o /dev/null \
		-w '%{speed_download}' "http://$(addr h1):$port/v1/arrays/x/data")
	best_null=$(awk -v a="$best_null" -v b="$s" 'BEGIN { print (b > a ? b : a) }')
done

echo "copy_bytes $bytes"
echo "copy_s $best_copy"
echo "first_copy_s $first_copy"
echo "perftest_bytes_s $(awk -v m="$pt_mibs" 'BEGIN { printf "%.0f", m * 1048576 }')"
echo "http_bytes_s $best_http"
echo "curl_null_bytes_s $best_null"
echo "broadcast_s $best_bcast"
echo "limited_bytes $lim_bytes"
echo "limited_copy_s $best_lcopy"
echo "limited_broadcast_s $best_lbcast"
echo "small_s $best_small"
echo "request_s $best_req"
echo "am_lat_s $(awk -v u="$lat_us" 'BEGIN { printf "%.9f", u / 1e6 }')"
