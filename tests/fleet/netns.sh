# tests/fleet/netns.sh - the test hosts of the fleet's scripts (sourced by
# tests/fleet/run.sh, tests/fleet/sender_killed.sh, tests/bench/fleet.sh):
# network namespaces PFX-h1.., each with one veth into a bridge that lives in
# namespace PFX-hub, addresses SUBNET.N/24, and each host's own hosts file
# (/etc/netns/NAME/hosts, which ip netns exec bind-mounts over /etc/hosts)
# naming every host. Nothing touches the machine's own network, and
# netns_cleanup removes all of it.
#
# The sourcing script sets: pfx, subnet (10.231.0), hosts (h1 h2 ...), token,
# port, tmp (a directory of its own), an associative array pid (HOST -> the
# pid of a process to kill at cleanup) and, optionally, api_timeout (curl's
# --max-time for api, default 5 s). A test suite (not the bench) also sets
# suite (its name in its lines), bin (the daemon) and failed=0, and calls
# suite_require before netns_up, and suite_end last: then skip, fail, ok,
# start, peers_of and until_s below are its.

hub=$pfx-hub

addr() { # addr h2 -> SUBNET.2
	echo "$subnet.${1#h}"
}
ns() {
	echo "$pfx-$1"
}
# inns HOST CMD...: runs CMD in HOST's namespace
inns() {
	local h=$1
	shift
	ip netns exec "$(ns "$h")" "$@"
}
# api HOST PATH [curl args]: the body of an authenticated call to HOST's daemon
api() {
	local h=$1 path=$2
	shift 2
	inns "$h" curl -s --max-time "${api_timeout:-5}" -H "Authorization: Bearer $token" "$@" \
		"http://$(addr "$h"):$port$path"
}

# Kills what pid holds, removes the namespaces, hosts files and tmp.
netns_cleanup() {
	local h
	for h in "${!pid[@]}"; do
		kill -KILL "${pid[$h]}" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	for h in "${hosts[@]}"; do
		ip netns del "$(ns "$h")" 2>/dev/null || true
		rm -rf "/etc/netns/$(ns "$h")"
	done
	ip netns del "$hub" 2>/dev/null || true
	rm -rf "$tmp"
}

# The namespaces, the bridge and the links (a leftover of a killed run
# removed first), the hosts files and tmp/token. Non-zero when no namespace
# can be made.
netns_up() {
	local h n o
	for h in "${hosts[@]}"; do
		ip netns del "$(ns "$h")" 2>/dev/null || true
	done
	ip netns del "$hub" 2>/dev/null || true
	ip netns add "$hub" || return 1
	ip -n "$hub" link set lo up
	ip -n "$hub" link add br0 type bridge
	ip -n "$hub" link set br0 up
	for h in "${hosts[@]}"; do
		n=$(ns "$h")
		ip netns add "$n"
		ip -n "$n" link set lo up
		ip -n "$n" link add eth0 type veth peer name "$h-br" netns "$hub"
		ip -n "$n" addr add "$(addr "$h")/24" dev eth0
		ip -n "$n" link set eth0 up
		ip -n "$hub" link set "$h-br" master br0
		ip -n "$hub" link set "$h-br" up
		mkdir -p "/etc/netns/$n"
		{
			echo "127.0.0.1 localhost"
			for o in "${hosts[@]}"; do
				echo "$(addr "$o") $o"
			done
		} >"/etc/netns/$n/hosts"
	done
	printf '%s\n' "$token" >"$tmp/token"
	chmod 600 "$tmp/token"
}

# ---- for the test suites -------------------------------------------------------

# skip WHY: the suite cannot run here; exits 0, or 1 under CI=true, where it
# must run
skip() {
	if [ "${CI:-}" = true ]; then
		echo "$suite: cannot run here ($1), and CI must run it" >&2
		exit 1
	fi
	echo "$suite: skipped: $1"
	exit 0
}
fail() {
	echo "$suite: FAIL $*"
	failed=1
}
ok() {
	echo "$suite: ok   $*"
}

# Root, ip, tc, curl, jq and the daemon, or skip (no daemon: an error).
suite_require() {
	local tool
	[ "$(id -u)" -eq 0 ] || skip "not root: network namespaces need it"
	for tool in ip tc curl jq; do
		command -v "$tool" >/dev/null || skip "$tool not found"
	done
	[ -x "$bin" ] || { echo "$suite: no daemon at $bin (make first)" >&2; exit 1; }
}

# start HOST [flags]: tstaged in HOST's namespace, its log in tmp/HOST.log,
# once it answers /livez (up to 10 s; else fail and non-zero)
start() {
	local h=$1 i
	shift
	UCX_TLS=tcp ip netns exec "$(ns "$h")" "$bin" --bind "$(addr "$h")" --port "$port" \
		--token-file "$tmp/token" --host-name "$h" --sim-devices 1 "$@" \
		>>"$tmp/$h.log" 2>&1 &
	pid[$h]=$!
	for ((i = 0; i < 100; i++)); do
		if inns "$h" curl -s -o /dev/null --max-time 1 "http://$(addr "$h"):$port/livez"; then
			return 0
		fi
		sleep 0.1
	done
	fail "$h did not start: $(tail -3 "$tmp/$h.log")"
	return 1
}

# suite_end: the suite's verdict. Every daemon in pid (a case that kills
# one on purpose unsets it) must still run; each is stopped as an operator
# would (SIGTERM; up to 60 s, a sanitized build being slow to drain) and
# must exit 0; and no host's log, a killed daemon's included, may hold a
# sanitizer's report (AddressSanitizer, LeakSanitizer - which runs at that
# exit -, UBSan, ThreadSanitizer), whose first line is shown. Prints
# "SUITE: passed", or each host's last log lines and "SUITE: FAILED" and
# exits 1.
suite_end() {
	local h i rc log line clean=1
	for h in "${!pid[@]}"; do
		if ! kill -TERM "${pid[$h]}" 2>/dev/null; then
			fail "$h's daemon died: $(tail -3 "$tmp/$h.log")"
			clean=0
			continue
		fi
		for ((i = 0; i < 600; i++)); do
			kill -0 "${pid[$h]}" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "${pid[$h]}" 2>/dev/null; then
			fail "$h's daemon did not exit within 60 s of SIGTERM"
			clean=0
			continue
		fi
		rc=0
		wait "${pid[$h]}" 2>/dev/null || rc=$?
		unset "pid[$h]"
		[ "$rc" -eq 0 ] && continue
		fail "$h's daemon exited $rc on SIGTERM: $(tail -3 "$tmp/$h.log")"
		clean=0
	done
	for log in "$tmp"/*.log; do
		[ -f "$log" ] || continue
		line=$(grep -m1 -E 'ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:' "$log") ||
			continue
		fail "$(basename "$log" .log)'s daemon reported: $(printf '%s' "$line" | cut -c1-240)"
		clean=0
	done
	[ "$clean" -eq 0 ] || ok "every daemon ran to the end and exited 0 on SIGTERM; no sanitizer report in any log"
	if [ "$failed" -ne 0 ]; then
		for h in "${hosts[@]}"; do
			echo "---- $h's log (last lines)"
			tail -8 "$tmp/$h.log" 2>/dev/null | cut -c1-300 || true
		done
		echo "$suite: FAILED"
		exit 1
	fi
	echo "$suite: passed"
}

# peers_of HOST: the other hosts' URLs, comma-separated (a --peers list)
peers_of() {
	local h=$1 o list=
	for o in "${hosts[@]}"; do
		[ "$o" = "$h" ] || list=${list:+$list,}http://$o:$port
	done
	echo "$list"
}

# until_s SECONDS CMD...: true once CMD is, polling every 0.2 s; false
# after SECONDS
until_s() {
	local limit=$1 t0
	shift
	t0=$(date +%s%N)
	while ! "$@"; do
		if [ $(( ($(date +%s%N) - t0) / 1000000 )) -ge $((limit * 1000)) ]; then
			return 1
		fi
		sleep 0.2
	done
}

# metric HOST NAME: the value of the unlabelled metric NAME on HOST
metric() {
	api "$1" /metrics | awk -v n="$2" '$1 == n { print $2 }'
}

# pools HOST: every pool's bytes in use on HOST, one "series value" a line
pools() {
	api "$1" /metrics | awk '/^tstage_pool_in_use_bytes\{/ { print $1, $2 }' | sort
}
