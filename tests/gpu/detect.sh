#!/usr/bin/env bash
# Runs the integration suite once more against the CUDA backend when this
# machine has a usable NVIDIA GPU and tstaged was built with CUDA; otherwise
# says why the GPU pass is skipped. Called by `make test`.
set -u
daemon=${1:-build/tstaged}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "gpu: no NVIDIA GPU on this machine; the CUDA pass is skipped (sim backend tested above)"
	exit 0
fi
if ! "$daemon" --version >/dev/null 2>&1; then
	echo "gpu: $daemon does not run" >&2
	exit 1
fi
echo "gpu: running the integration suite against the CUDA backend"
status=0
for t in "$(dirname "$daemon")"/tests/it_*; do
	TSTAGED="$daemon" TS_TEST_BACKEND=cuda "$t" || status=1
done
exit $status
