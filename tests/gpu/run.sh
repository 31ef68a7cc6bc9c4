#!/usr/bin/env bash
# gpu-bundle/run.sh - the first minutes on a CUDA machine, as one bounded,
# prepared check (make gpu-bundle; needs nothing installed but the NVIDIA
# driver, the CUDA runtime and cuBLAS of the machine's CUDA toolkit, and
# NCCL, from the toolkit or the nvidia-nccl wheel of its Python):
#
#   1. the unit suites that touch CUDA, in their CUDA cases (test_kernels
#      compares every training kernel on CUDA with the CPU kernel on the
#      same inputs: reductions bit for bit, the rest to a few ulp);
#   2. the guide's four policies on the GPU with measured peak = predicted
#      (it_models' guide_steps);
#   3. the 4 x 7168 Adam model timed, on the device and offloaded;
#   4. the transfer bench against a raw cudaMemcpyAsync loop in the same
#      process;
#   5. compute-sanitizer's memcheck on one short run, where it is installed;
#   6. what the GPU path added since the first bundle: device leases over
#      CUDA IPC between two processes (it_lease: the daemon exports, the
#      suite opens the handle and reads and writes the bytes), token models
#      on the CUDA kernels (it_tokens), and bfloat16/float16 steps through
#      cublasGemmEx against JAX (it_optax, where python3 has jax and optax);
#   7. the other integration suites against the CUDA backend.
#
# Bounded: TS_GPU_BUDGET_S (default 480) for everything, TS_GPU_STEP_S
# (default 150) per step; a step runs under timeout with what is left of
# both, and is skipped once under 10 s are left. Every step's outcome and
# time go to the summary file, TS_GPU_SUMMARY (default ./gpu-summary.txt),
# with the figures (step times, transfer ratios, CUDA-vs-CPU agreement);
# each step's output to gpu-logs/ beside it. Exits 1 when a step failed or
# timed out, 0 otherwise. TS_GPU_SKIP names steps not to run (space
# separated, as the summary names them: "unit-test_exec lease-ipc"), e.g.
# to spend a second, shorter lease on the steps that failed.
#
# Without a GPU (nvidia-smi lists none) it says so and exits 0 at once.
# TS_GPU_FAKE=1 runs it under the CPU stand-in of the CUDA runtime
# (../shared/fakecuda, whose lib/ must come first on LD_LIBRARY_PATH):
# smaller sizes (TS_GPU_LARGE_D, BENCH_MiB) and the integration cases that
# exercise GPU memory only, as tests/gpu/fakecuda.sh does in CI.
set -u
here=$(cd "$(dirname "$0")" && pwd)
budget=${TS_GPU_BUDGET_S:-480}
step_max=${TS_GPU_STEP_S:-150}
summary=${TS_GPU_SUMMARY:-$PWD/gpu-summary.txt}
logs=$(dirname "$summary")/gpu-logs
fake=${TS_GPU_FAKE:-0}
start=$(date +%s)
deadline=$((start + budget))

mkdir -p "$logs"
: >"$summary"
summary=$(cd "$(dirname "$summary")" && pwd)/$(basename "$summary")
logs=$(dirname "$summary")/gpu-logs
# the suites read their data files (tests/data/) from the folder they run in
cd "$here" || exit 1
note() { echo "$*" | tee -a "$summary"; }

if [ "$fake" != 1 ]; then
	if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
		note "gpu: no NVIDIA GPU on this machine (nvidia-smi lists none): nothing to check"
		exit 0
	fi
	# the bundle's libraries, then the machine's CUDA runtime and cuBLAS,
	# then NCCL where the loader does not know it: the toolkit's folder, or
	# the nvidia-nccl wheel of the machine's Python
	cuda_lib=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 2>/dev/null | head -1)
	nccl_lib=
	if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 ' &&
		! [ -e "$cuda_lib/libnccl.so.2" ]; then
		nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
	fi
	export LD_LIBRARY_PATH="$here/lib${cuda_lib:+:$cuda_lib}${nccl_lib:+:$nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
	# the stand-in's libraries stay first
	export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$here/lib"
fi
# an older libstdc++ never goes ahead of the system's: only where there is none
if ! ldconfig -p 2>/dev/null | grep 'libstdc++\.so\.6 ' >/dev/null; then
	export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$here/lib/compat"
fi
export TSTAGED="$here/bin/tstaged"
export TS_TEST_BACKEND=cuda
export TS_IT_PY_DIR="$here/tests/py"
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-300}
large_d=${TS_GPU_LARGE_D:-7168}
bench_mib=${BENCH_MiB:-1024}
if [ "$fake" = 1 ]; then
	large_d=${TS_GPU_LARGE_D:-256}
	bench_mib=${BENCH_MiB:-64}
fi

if [ "$fake" = 1 ]; then
	note "gpu: under the CPU stand-in of the CUDA runtime (TS_GPU_FAKE=1)"
else
	note "gpu: $(nvidia-smi -L 2>/dev/null | head -4 | tr '\n' ';')"
fi
note "gpu: $("$TSTAGED" --version 2>&1 | head -1); budget ${budget} s, at most ${step_max} s a step"

failed=0
# step NAME LIMIT_S CMD...: runs CMD under the remaining budget, logs to
# gpu-logs/NAME.log, one summary line.
step() {
	local name=$1 limit=$2 now left rc t0 t1 log
	shift 2
	log=$logs/$name.log
	case " ${TS_GPU_SKIP:-} " in
	*" $name "*)
		note "SKIP    $name (TS_GPU_SKIP)"
		return 0
		;;
	esac
	now=$(date +%s)
	left=$((deadline - now))
	[ "$limit" -gt "$step_max" ] && limit=$step_max
	[ "$limit" -gt "$left" ] && limit=$left
	if [ "$limit" -lt 10 ]; then
		note "SKIP    $name (budget spent)"
		return 0
	fi
	t0=$(date +%s.%N)
	timeout -k 5 "$limit" "$@" >"$log" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	local secs
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
	if grep -q 'FAKECUDA VIOLATION' "$log"; then
		note "FAIL    $name ${secs}s (FAKECUDA VIOLATION)"
		grep 'FAKECUDA VIOLATION' "$log" | head -5 | sed 's/^/        /' | tee -a "$summary"
		failed=1
	elif [ $rc -eq 0 ]; then
		note "PASS    $name ${secs}s"
	elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
		note "TIMEOUT $name after ${limit}s"
		failed=1
	else
		note "FAIL    $name ${secs}s (exit $rc)"
		grep -E ':F:|:E:|Checks:|error' "$log" | head -8 | sed 's/^/        /' | tee -a "$summary"
		failed=1
	fi
	return 0
}

# 1. unit suites with CUDA cases
for t in test_kernels test_exec test_device test_stage test_array_io test_colocate; do
	[ -x "$here/tests/$t" ] && step "unit-$t" 240 "$here/tests/$t"
done
# collectives (NCCL) need two GPUs at least
if [ -x "$here/tests/test_comm" ] && { [ "$fake" = 1 ] ||
	[ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; }; then
	step unit-test_comm 120 "$here/tests/test_comm"
	step unit-test_replicas 240 "$here/tests/test_replicas"
else
	note "skip    unit-test_comm, unit-test_replicas: one GPU (NCCL's collectives need two)"
fi
if [ -f "$logs/unit-test_kernels.log" ]; then
	if grep -q ':cuda_vs_cpu:' "$logs/unit-test_kernels.log"; then
		note "        kernels cuda vs cpu: differ, see $logs/unit-test_kernels.log"
	else
		note "        kernels cuda vs cpu: agree (reductions bit for bit, the rest within a few ulp)"
	fi
fi
# 2. the guide's policies on the GPU: measured peak = predicted, same bits
step guide-policies 120 env CK_RUN_CASE=guide_steps "$here/tests/it_models"
# 3. the large Adam model, timed
step "adam-4x$large_d" 150 env CK_RUN_CASE=large TS_TEST_LARGE_D="$large_d" "$here/tests/it_models"
grep '^large:' "$logs/adam-4x$large_d.log" 2>/dev/null | sed 's/^/        /' | tee -a "$summary"
# 4. transfers against the raw runtime loop
step transfer-bench 120 env BENCH_MiB="$bench_mib" "$here/bench/bench_transfer"
grep '^xfer' "$logs/transfer-bench.log" 2>/dev/null | sed 's/^/        /' | tee -a "$summary"
# 5. memcheck on one short run
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
	/usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
if [ -n "$sanitizer" ] && [ -x "$sanitizer" ]; then
	step memcheck 120 env CK_FORK=no CK_RUN_CASE=cuda_vs_cpu "$sanitizer" --tool memcheck \
		--error-exitcode 1 "$here/tests/test_kernels"
else
	note "SKIP    memcheck (compute-sanitizer is not installed)"
fi
# 6. device leases over CUDA IPC, token models, mixed precision against JAX
step lease-ipc 120 "$here/tests/it_lease"
step token-models 240 "$here/tests/it_tokens"
if python3 -c 'import jax, jaxlib, optax' >/dev/null 2>&1; then
	# under the stand-in the MLP cases only (its GPT cases take minutes
	# there; test_exec's GPT cases run on CUDA in step 1)
	if [ "$fake" = 1 ]; then
		step lowp-vs-jax 240 env CK_RUN_CASE=optax "$here/tests/it_optax"
	else
		step lowp-vs-jax 240 "$here/tests/it_optax"
	fi
else
	note "SKIP    lowp-vs-jax (python3 here has no jax, jaxlib and optax)"
fi
# 7. the other integration suites on the CUDA device
if [ "$fake" = 1 ]; then
	# the stand-in is slow to map its memory: the cases on GPU memory only
	step it-arrays 150 env CK_RUN_CASE=on_backend "$here/tests/it_arrays"
	step it-models-create 120 env CK_RUN_CASE=create "$here/tests/it_models"
else
	gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
	for t in "$here"/tests/it_*; do
		case $(basename "$t") in it_lease | it_tokens | it_optax) continue ;; esac
		if [ "$(basename "$t")" = it_replicas ] && [ "$gpus" -lt 2 ]; then
			note "skip    it_replicas: one GPU (data parallel needs two)"
			continue
		fi
		[ -x "$t" ] && step "$(basename "$t")" 150 "$t"
	done
fi

note "gpu: $(( $(date +%s) - start )) s of ${budget} s; $(grep -c '^PASS' "$summary") passed," \
	"$(grep -cE '^(FAIL|TIMEOUT)' "$summary") failed, $(grep -c '^SKIP' "$summary") skipped;" \
	"summary in $summary"
exit $failed
