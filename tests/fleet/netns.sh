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
# --max-time for api, default 5 s).

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
