#!/usr/bin/env bash
# Installs the Debian packages tstage builds and tests with, when any is missing.
# As root it runs apt-get; otherwise it prints the exact command and fails.
set -euo pipefail

# what building tstaged needs (libcurl: the fleet's poller; libhwloc: the
# NUMA topology; libucx: the fleet's data path; the Dockerfile's build stage
# installs the same, tests/deploy/check_dockerfile.py checks it), then what the tests add
# (prometheus: promtool and the live Prometheus of tests/deploy/prometheus.sh)
build_pkgs=(build-essential pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev
	libcurl4-openssl-dev libhwloc-dev libucx-dev)
test_pkgs=(check libsubunit-dev python3-numpy python3-pip jq python3-yaml
	prometheus)
pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}")
# make pytest: the Python client's virtual environment
pkgs+=(python3-venv)
# make bench (TS_DEPS_BENCH=1) adds the servers and tools its references run
# (ucx_perftest: bench_fleet)
[ "${TS_DEPS_BENCH:-0}" = 1 ] && pkgs+=(nginx-light redis-server ucx-utils)
# the API checks (TS_DEPS_API=1, tests/api/*.sh): headless Chromium for the
# dashboard, PyYAML for the route-vs-spec check, venv for their PyPI tools
# (openapi-spec-validator, schemathesis: installed by tests/api/lib.sh under build/)
[ "${TS_DEPS_API:-0}" = 1 ] && pkgs+=(chromium python3-yaml python3-venv)
[ "${TS_DEPS_EXTRA:-}" ] && read -r -a extra <<<"$TS_DEPS_EXTRA" && pkgs+=("${extra[@]}")

missing=()
for p in "${pkgs[@]}"; do
	status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$status" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	cmd="apt-get install -y --no-install-recommends ${missing[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		echo "tstage: missing packages: ${missing[*]}" >&2
		echo "run: sudo apt-get update && sudo $cmd" >&2
		exit 1
	fi
	echo "tstage: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	$cmd
fi

# The integration tests read and write fixtures with numpy and the reference
# safetensors package, and check dtype conversions against ml_dtypes (the
# bfloat16 JAX uses), which Debian does not ship: from PyPI, only when
# python3 cannot import them (PEP 668 systems need --break-system-packages).
if ! python3 -c 'import safetensors, numpy, ml_dtypes' 2>/dev/null; then
	echo "tstage: installing the python packages safetensors, numpy and ml_dtypes" >&2
	python3 -m pip install --quiet safetensors numpy ml_dtypes 2>/dev/null ||
		python3 -m pip install --quiet --break-system-packages safetensors numpy ml_dtypes
fi

# The optax comparisons (tests/integration/it_optax) run the model in JAX
# with optax itself: jax, jaxlib (CPU wheels) and optax from PyPI, only when
# python3 cannot import them.
if ! python3 -c 'import jax, jaxlib, optax' 2>/dev/null; then
	echo "tstage: installing the python packages jax, jaxlib and optax" >&2
	python3 -m pip install --quiet jax jaxlib optax 2>/dev/null ||
		python3 -m pip install --quiet --break-system-packages jax jaxlib optax
fi
