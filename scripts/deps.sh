#!/usr/bin/env bash
# Installs the Debian packages tstage builds and tests with, when any is missing.
# As root it runs apt-get; otherwise it prints the exact command and fails.
set -euo pipefail

pkgs=(build-essential pkg-config libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev
      check libsubunit-dev libopenblas-dev)
[ "${TS_DEPS_EXTRA:-}" ] && read -r -a extra <<<"$TS_DEPS_EXTRA" && pkgs+=("${extra[@]}")

missing=()
for p in "${pkgs[@]}"; do
	status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$status" = installed ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

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
