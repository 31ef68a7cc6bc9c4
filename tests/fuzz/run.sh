#!/usr/bin/env bash
# Runs every built libFuzzer target for a bounded time on a scratch copy of
# its seed corpus. Usage: tests/fuzz/run.sh BUILD_FUZZ_DIR [seconds per target]
# FUZZ_SEED fixes libFuzzer's seed (CI's brief pass replays the same inputs
# each run; long exploratory runs leave it unset for a random seed).
set -euo pipefail
dir=$1
secs=${2:-10}
for bin in "$dir"/fuzz_*; do
	[ -x "$bin" ] || continue
	t=${bin##*/fuzz_}
	work="$dir/corpus_$t"
	rm -rf "$work" && mkdir -p "$work"
	cp tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
	if ! "$bin" ${FUZZ_SEED:+-seed="$FUZZ_SEED"} -max_total_time="$secs" -timeout=10 -artifact_prefix="$dir/$t-" -rss_limit_mb=2048 "$work" >"$dir/$t.log" 2>&1; then
		tail -40 "$dir/$t.log"
		echo "fuzz: $t FAILED (crash input saved beside the log)" >&2
		exit 1
	fi
	runs=$(grep -Eo '^#[0-9]+' "$dir/$t.log" | tail -1 | tr -d '#')
	echo "fuzz: $t ok: ${runs:-0} inputs in ${secs}s"
done
