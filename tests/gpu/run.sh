#!/usr/bin/env bash
# Runs on a CUDA machine from a gpu-bundle folder (make gpu-bundle): the unit
# suites, the integration suite against the CUDA backend, and the transfer
# benches. Needs nothing installed but the NVIDIA driver.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# the bundle's libraries, then the machine's CUDA runtime and cuBLAS
cuda_lib=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$here/lib${cuda_lib:+:$cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TSTAGED="$here/bin/tstaged"
export TS_TEST_BACKEND=cuda
export TS_IT_PY_DIR="$here/tests/py"
export CK_DEFAULT_TIMEOUT=300
nvidia-smi -L 2>/dev/null || echo "gpu: nvidia-smi not found"
"$TSTAGED" --version
status=0
echo "== devices"
"$TSTAGED" --port 0 --port-file /tmp/tstage-gpu.port --log-level warn &
pid=$!
for _ in $(seq 50); do [ -s /tmp/tstage-gpu.port ] && break; sleep 0.1; done
port=$(cat /tmp/tstage-gpu.port 2>/dev/null)
if command -v curl >/dev/null; then
	curl -s "localhost:$port/v1/backends"; echo
	curl -s "localhost:$port/v1/devices"; echo
fi
kill -TERM "$pid"; wait "$pid"
echo "== unit"
for t in "$here"/tests/test_*; do "$t" || status=1; done
echo "== integration (cuda backend)"
for t in "$here"/tests/it_*; do "$t" || status=1; done
echo "== bench"
for b in "$here"/bench/bench_transfer; do [ -x "$b" ] && "$b"; done
exit $status
