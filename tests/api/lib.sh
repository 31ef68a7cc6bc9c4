# lib.sh - what the API checks share: the daemon under test on an ephemeral
# port (started by start_daemon, stopped on exit by its pid) and the Python
# tools, in a virtual environment under build/ made on first use.
# Sourced by tests/api/*.sh from the repository root.

TSTAGED=${TSTAGED:-build/tstaged}
API_VENV=${API_VENV:-build/api-venv}
API_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tstage-api.XXXXXX")
DAEMON_PIDS=()

api_cleanup() {
	for pid in "${DAEMON_PIDS[@]}"; do
		kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	done
	rm -rf "$API_TMP"
}
trap api_cleanup EXIT

# start_daemon NAME [FLAGS...]: runs tstaged; sets PORT and the daemon's log
# is $API_TMP/NAME.log.
start_daemon() {
	local name=$1 i
	shift
	rm -f "$API_TMP/$name.port"
	"$TSTAGED" --port 0 --port-file "$API_TMP/$name.port" "$@" >"$API_TMP/$name.log" 2>&1 &
	DAEMON_PIDS+=($!)
	for i in $(seq 100); do
		[ -s "$API_TMP/$name.port" ] && break
		sleep 0.1
	done
	PORT=$(cat "$API_TMP/$name.port" 2>/dev/null) || {
		echo "tstaged did not start:" >&2
		cat "$API_TMP/$name.log" >&2
		exit 1
	}
}

# venv PACKAGES...: the virtual environment with these PyPI packages.
venv() {
	if [ ! -x "$API_VENV/bin/python" ]; then
		python3 -m venv "$API_VENV"
	fi
	if ! "$API_VENV/bin/python" -c 'import sys' 2>/dev/null ||
		! "$API_VENV/bin/pip" show -q "$@" >/dev/null 2>&1; then
		"$API_VENV/bin/pip" install -q "$@"
	fi
}
