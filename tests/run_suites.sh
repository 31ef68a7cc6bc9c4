#!/usr/bin/env bash
# tests/run_suites.sh - runs Check suites, up to JOBS at once (default: the
# number of CPUs), each with its output in LOGS/NAME.log (default
# build/test-logs); prints one line per suite as it ends (its time and
# Check's summary) and, for a suite that failed, its failures and the tail
# of its log. Exits 1 when any suite failed, after every suite has run.
#
#   tests/run_suites.sh BINARY...      (the environment passes through:
#                                       TSTAGED, CK_DEFAULT_TIMEOUT, ...)
#
# Most suites wait on daemons, sockets and child processes more than they
# compute; two at a time keep both of a small machine's cores busy. The
# suites share nothing but the machine: every daemon takes a port of its
# own (--port 0), every file its own temporary folder.
set -u
jobs=${JOBS:-$(nproc)}
logs=${LOGS:-build/test-logs}
mkdir -p "$logs"
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1

failed=0
declare -A started=() name_of=()

# report PID RC: the line for the suite that PID ran
report() {
	local pid=$1 rc=$2 name log secs summary
	name=${name_of[$pid]}
	log=$logs/$name.log
	secs=$(($(date +%s) - started[$pid]))
	summary=$(grep -h 'Checks:' "$log" | tail -1)
	if [ "$rc" -eq 0 ]; then
		echo "ok   $name (${secs} s) $summary"
	else
		echo "FAIL $name (${secs} s, exit $rc) $summary; log: $log"
		grep -E ':F:|:E:' "$log" | head -20 | sed 's/^/    /'
		tail -15 "$log" | sed 's/^/    | /'
		failed=1
	fi
}

# reap: waits for any one suite to end and reports it
reap() {
	local pid rc
	wait -n -p pid
	rc=$?
	report "$pid" "$rc"
	unset "started[$pid]" "name_of[$pid]"
}

for bin in "$@"; do
	while [ "${#started[@]}" -ge "$jobs" ]; do
		reap
	done
	name=$(basename "$bin")
	"$bin" >"$logs/$name.log" 2>&1 &
	started[$!]=$(date +%s)
	name_of[$!]=$name
done
while [ "${#started[@]}" -gt 0 ]; do
	reap
done
exit $failed
