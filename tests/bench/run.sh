#!/usr/bin/env bash
# Runs every bench binary in BUILD/bench (make bench) and prints one table:
# this header once, then each binary's rows (benchlib.c's BENCH_ROW_FORMAT,
# same widths). Benches talk to BUILD/tstaged; their notes go to stderr.
# Exits non-zero when a bench fails to run, or, with BENCH_STRICT=1, when a
# row misses its target.
set -u
build=${1:-build}
export TSTAGED=${TSTAGED:-$build/tstaged}

shopt -s nullglob
benches=("$build"/bench/bench_*)
if [ ${#benches[@]} -eq 0 ]; then
	echo "bench: no bench binaries in $build/bench (run make bench)" >&2
	exit 1
fi

fmt='%-44s | %-16s | %-26s | %-6s | %-16s | %s\n'
# shellcheck disable=SC2059
printf "$fmt" bench value reference ratio target ok
# shellcheck disable=SC2059
printf "$fmt" "$(printf -- '-%.0s' {1..44})" "$(printf -- '-%.0s' {1..16})" \
	"$(printf -- '-%.0s' {1..26})" "------" "$(printf -- '-%.0s' {1..16})" "--"

status=0
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for b in "${benches[@]}"; do
	[ -x "$b" ] || continue
	if ! "$b" | tee -a "$rows"; then
		echo "bench: $(basename "$b") failed" >&2
		status=1
	fi
done

missed=$(awk -F'|' '{ gsub(/ /, "", $6) } $6 == "no" { n++ } END { print n + 0 }' "$rows")
total=$(awk -F'|' '{ gsub(/ /, "", $6) } $6 == "yes" || $6 == "no" { n++ } END { print n + 0 }' "$rows")
echo "bench: $((total - missed)) of $total targets met" >&2
if [ "$missed" -gt 0 ] && [ "${BENCH_STRICT:-0}" = 1 ]; then
	status=1
fi
exit $status
