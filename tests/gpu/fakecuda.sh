#!/usr/bin/env bash
# tests/gpu/fakecuda.sh - the CUDA build of the suites, without a GPU: builds
# the CPU stand-in of libcudart and libcublas (../shared/fakecuda, which
# runs train/cuda_kernels.cu's own device code and checks every CUDA call
# strictly) and runs under it, with TS_TEST_BACKEND=cuda on two stand-in
# GPUs:
#
#   plain    every unit suite, and every integration suite on the
#            stand-in's GPUs (it_foundation's endpoints; it_faults needs the
#            fault build and runs on sim in make faults), the fence on;
#   shuffle  FAKECUDA_SHUFFLE=1 (blocks in random order): the suites whose
#            results are compared bit for bit (kernels, exec, models' guide);
#   delay    FAKECUDA_COPY_DELAY_US (copies late, the host ahead), with
#            shuffled blocks: the unit suites that order copies against
#            kernels and each other (exec, stage, device, kernels);
#   bundle   make gpu-bundle, bundle_check.sh, and gpu-bundle/run.sh end to
#            end (TS_GPU_FAKE=1) within its budget.
#
# Any "FAKECUDA VIOLATION" (stderr or $FAKECUDA_LOG) fails the run. Usage:
#   tests/gpu/fakecuda.sh [plain|shuffle|delay|bundle ...]   (default: all)
# Suites of a pass run JOBS at a time (default: one per CPU). BUILD (default
# build), FAKECUDA_DIR (default ../shared/fakecuda) and
# FAKECUDA_COPY_DELAY_US (default 300) may be set.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
fakedir=${FAKECUDA_DIR:-$root/../shared/fakecuda}
passes=${*:-plain shuffle delay bundle python}
logs=$build/fakecuda/logs
t_start=$(date +%s)

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
	echo "fakecuda: no nvcc here: the CUDA build cannot be made; skipped"
	exit 0
fi
if [ ! -f "$fakedir/build.sh" ]; then
	echo "fakecuda: no stand-in at $fakedir" >&2
	exit 1
fi
mkdir -p "$logs"
rm -f "$logs"/*.log "$logs"/*.verdict
echo "fakecuda: building the CUDA build and the stand-in"
bins=$(ls tests/unit/test_*.c tests/integration/it_*.c |
	sed -E "s#tests/(unit|integration)/(.*)\.c#$build/tests/\2#")
# shellcheck disable=SC2086
nice make -j2 CUDA=1 all $bins >"$logs/make.log" 2>&1 || { tail -20 "$logs/make.log" >&2; exit 1; }
SRC=$root OUT=$root/$build/fakecuda sh "$fakedir/build.sh" >/dev/null || exit 1

export LD_LIBRARY_PATH=$root/$build/fakecuda/lib
export TS_TEST_BACKEND=cuda
# the fence (guard pages after each allocation) is the stand-in's default;
# said here so that no environment turns it off for this run
export FAKECUDA_FENCE=1
export FAKECUDA_DEVICES=2
# small stand-in GPUs: mapping and unmapping their memory is the cost here
export FAKECUDA_MEM_MB=${FAKECUDA_MEM_MB:-1024}
export FAKECUDA_LOG=$root/$logs/violations.log
export TSTAGED=$root/$build/tstaged
export CK_DEFAULT_TIMEOUT=300
: >"$FAKECUDA_LOG"

failed=0
# suites of a pass run JOBS at a time (default: one per CPU): the stand-in
# runs a suite's kernels on one thread at a time, so two suites keep two
# cores busy; each suite's verdict is a file, read by settle
jobs=${JOBS:-$(nproc)}
# run NAME [VAR=value ...] BINARY: one suite in the background, its output
# in logs/NAME.log, its verdict in logs/NAME.verdict
run() {
	local name=$1
	shift
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
		wait -n
	done
	(
		t0=$(date +%s)
		env "$@" >"$logs/$name.log" 2>&1
		rc=$?
		if [ $rc -ne 0 ] || grep -q 'FAKECUDA VIOLATION' "$logs/$name.log"; then
			{
				echo "fakecuda: FAIL $name ($(( $(date +%s) - t0 )) s, exit $rc)"
				grep -E ':F:|:E:|FAKECUDA VIOLATION|Checks:' "$logs/$name.log" | head -10 |
					sed 's/^/    /'
			} >"$logs/$name.verdict"
		else
			echo "fakecuda: ok   $name ($(( $(date +%s) - t0 )) s) $(grep -h 'Checks:' "$logs/$name.log" | tail -1)" \
				>"$logs/$name.verdict"
		fi
		cat "$logs/$name.verdict"
	) &
}
# settle: waits for every suite started by run and counts the failures
settle() {
	wait
	if grep -qs '^fakecuda: FAIL' "$logs"/*.verdict; then
		failed=1
	fi
}

for pass in $passes; do
	case $pass in
	plain)
		for t in tests/unit/test_*.c; do
			b=$(basename "$t" .c)
			run "$b" "$build/tests/$b"
		done
		# collectives and data-parallel steps over 4 and 8 GPUs, shuffled
		# (the loop ran them over 2)
		for n in 4 8; do
			for t in test_comm test_replicas; do
				run "$t-${n}gpus" FAKECUDA_DEVICES=$n FAKECUDA_SHUFFLE=1 FAKECUDA_MEM_MB=512 \
					CK_RUN_CASE=cuda "$build/tests/$t"
			done
		done
		# it_foundation's http and daemons cases start many daemons and
		# touch no device: its endpoints on the stand-in's GPUs only
		run it_foundation-endpoints CK_RUN_CASE=endpoints "$build/tests/it_foundation"
		for t in it_moves it_operations it_shardings it_metrics; do
			run "$t" "$build/tests/$t"
		done
		run it_arrays CK_RUN_CASE=on_backend "$build/tests/it_arrays"
		run it_models "$build/tests/it_models"
		run it_evaluate "$build/tests/it_evaluate"
		run it_replicas "$build/tests/it_replicas"
		run it_rows "$build/tests/it_rows"
		# it_lease, it_tokens and it_optax's MLP cases run in the bundle
		# pass (gpu-bundle/run.sh's step 6), not twice
		for t in it_integrity it_badinput it_hostile it_probe it_convert it_unix \
			it_checkpoint it_shared_json it_restart it_trace; do
			run "$t" "$build/tests/$t"
		done
		# a step's trace on the stand-in's GPU: its copies and kernels (timed
		# by CUDA events) in the plan's order, the Trace Event Format's rules
		run api-trace TRACE_DEVICE=cuda:0 tests/api/trace.sh
		# the eight GPUs of tests/data/two_socket.xml, placed by bus id, peers
		# in two groups of four (one per socket), the second ranked lower
		run test_topology-gpus FAKECUDA_DEVICES=8 CK_RUN_CASE=cuda \
			FAKECUDA_PEERS=0-1-2-3,4-5-6-7 FAKECUDA_P2P_RANK=0,1 \
			TS_TEST_PEER_GROUPS=0-1-2-3,4-5-6-7 \
			FAKECUDA_PCI_BUS_IDS=0000:11:00.0,0000:12:00.0,0000:13:00.0,0000:14:00.0,0000:81:00.0,0000:82:00.0,0000:83:00.0,0000:84:00.0 \
			"$build/tests/test_topology"
		# "auto" meshes of those eight GPUs, the sockets' bus ids interleaved
		run test_mesh_layout-gpus FAKECUDA_DEVICES=8 CK_RUN_CASE=cuda \
			FAKECUDA_PCI_BUS_IDS=0000:81:00.0,0000:11:00.0,0000:82:00.0,0000:12:00.0,0000:83:00.0,0000:13:00.0,0000:84:00.0,0000:14:00.0 \
			"$build/tests/test_mesh_layout"
		# and copies between them by peer access or staged, as the matrix says
		run it_topology-gpus FAKECUDA_DEVICES=8 FAKECUDA_MEM_MB=256 CK_RUN_CASE=cuda \
			FAKECUDA_PEERS=0-1-2-3,4-5-6-7 \
			FAKECUDA_PCI_BUS_IDS=0000:11:00.0,0000:12:00.0,0000:13:00.0,0000:14:00.0,0000:81:00.0,0000:82:00.0,0000:83:00.0,0000:84:00.0 \
			"$build/tests/it_topology"
		# its daemons take a small device fraction of a larger stand-in GPU
		run it_cuda_seams FAKECUDA_MEM_MB=4096 "$build/tests/it_cuda_seams"
		settle
		;;
	shuffle)
		# test_exec's cuda case: its sim case and its GPT steps (cuda_gpt)
		# ran in the plain pass, and the stand-in's knobs touch neither
		run test_kernels-shuffle FAKECUDA_SHUFFLE=1 "$build/tests/test_kernels"
		run test_exec-shuffle FAKECUDA_SHUFFLE=1 CK_RUN_CASE=cuda "$build/tests/test_exec"
		run it_models-guide_steps-shuffle FAKECUDA_SHUFFLE=1 CK_RUN_CASE=guide_steps \
			"$build/tests/it_models"
		settle
		;;
	delay)
		for t in test_exec test_stage test_device test_kernels; do
			case=
			[ "$t" = test_exec ] && case=cuda
			run "$t-delay" FAKECUDA_COPY_DELAY_US="${FAKECUDA_COPY_DELAY_US:-300}" \
				FAKECUDA_SHUFFLE=1 ${case:+CK_RUN_CASE=$case} "$build/tests/$t"
		done
		run it_cuda_seams-delay FAKECUDA_MEM_MB=4096 FAKECUDA_SHUFFLE=1 \
			FAKECUDA_COPY_DELAY_US="${FAKECUDA_COPY_DELAY_US:-300}" "$build/tests/it_cuda_seams"
		settle
		;;
	bundle)
		t0=$(date +%s)
		if ! nice make -j2 CUDA=1 gpu-bundle >"$logs/bundle-make.log" 2>&1; then
			echo "fakecuda: FAIL gpu-bundle"
			tail -5 "$logs/bundle-make.log" | sed 's/^/    /'
			failed=1
			continue
		fi
		tmp=$(mktemp -d)
		tar -C "$tmp" -xzf "$build/gpu-bundle.tar.gz"
		# the stand-in runs kernels thread by thread: more time than the
		# 480 s a GPU gets, and up to 240 s a step
		budget=${TS_GPU_BUDGET_S:-900}
		# what the plain pass ran from the same build is not run twice:
		# the unit suites and the integration cases of run.sh's steps 1, 2
		# and 7 (the bundle's own packaging, its large model, transfers,
		# leases, token models and JAX comparisons still run from it)
		skip=
		case " $passes " in
		*" plain "*)
			skip="unit-test_kernels unit-test_exec unit-test_device unit-test_stage unit-test_comm"
			skip="$skip unit-test_replicas"
			skip="$skip unit-test_array_io unit-test_colocate guide-policies"
			skip="$skip it-arrays it-models-create"
			;;
		esac
		if TS_GPU_FAKE=1 TS_GPU_SKIP="$skip" TS_GPU_BUDGET_S=$budget TS_GPU_STEP_S=${TS_GPU_STEP_S:-240} \
			TS_GPU_SUMMARY="$tmp/summary.txt" \
			"$tmp/gpu-bundle/run.sh" >"$logs/run.sh.log" 2>&1; then
			echo "fakecuda: ok   gpu-bundle/run.sh ($(( $(date +%s) - t0 )) s with the bundle)"
		else
			echo "fakecuda: FAIL gpu-bundle/run.sh"
			failed=1
		fi
		sed 's/^/    /' "$tmp/summary.txt"
		cp "$tmp/summary.txt" "$logs/gpu-summary.txt"
		rm -rf "$tmp"
		;;
	python)
		# the Python client's device leases (test_cuda_lease.py): the test
		# process opens the daemon's CUDA IPC handles through the stand-in's
		# libcudart (ctypes), as a client on a GPU node does
		if ! nice make build/pyvenv/installed >"$logs/pyvenv.log" 2>&1; then
			echo "fakecuda: FAIL python (the venv: $logs/pyvenv.log)"
			failed=1
			continue
		fi
		# -rs: a skip is named in the log (the module skips only without cuda)
		run python-lease build/pyvenv/bin/pytest -q -rs -p no:cacheprovider \
			clients/python/tests/test_cuda_lease.py
		settle
		;;
	*)
		echo "fakecuda: unknown pass '$pass' (plain, shuffle, delay, bundle)" >&2
		failed=1
		;;
	esac
done

if [ -s "$FAKECUDA_LOG" ] && grep -q 'VIOLATION' "$FAKECUDA_LOG"; then
	echo "fakecuda: FAKECUDA VIOLATION lines in $FAKECUDA_LOG:"
	grep 'VIOLATION' "$FAKECUDA_LOG" | sort | uniq -c | head -10 | sed 's/^/    /'
	failed=1
fi
echo "fakecuda: $(( $(date +%s) - t_start )) s; $([ $failed -eq 0 ] && echo passed || echo FAILED)"
exit $failed
