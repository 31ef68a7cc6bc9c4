#!/usr/bin/env bash
# tests/make/floors.sh - no file includes a header from a floor above its
# own. The floors are the Makefile's FLOORS, bottom to top; folders joined
# by '|' share a floor and do not see each other. A file in a floor's folder
# may include (#include "dir/x.h") headers of its own folder and of the
# floors below; a bare "x.h" means its own folder. Every offending include
# is printed as file:line. Usage: floors.sh [ROOT] (default: the checkout).
set -u
root=${1:-"$(dirname "$0")/../.."}
cd "$root" || exit 2
floors=$(sed -n 's/^FLOORS[[:space:]]*:=[[:space:]]*//p' Makefile)
if [ -z "$floors" ]; then
	echo "floors: no FLOORS line in $root/Makefile"
	echo "0 passed, 1 failed"
	exit 1
fi
awk -v floors="$floors" '
BEGIN {
	n = split(floors, level, /[[:space:]]+/)
	for (i = 1; i <= n; i++) {
		m = split(level[i], dirs, "|")
		for (j = 1; j <= m; j++)
			floor_of[dirs[j]] = i
	}
}
FNR == 1 {
	dir = FILENAME
	sub(/\/[^\/]*$/, "", dir)
}
/^[[:space:]]*#[[:space:]]*include[[:space:]]*"/ {
	inc = $0
	sub(/^[^"]*"/, "", inc)
	sub(/".*$/, "", inc)
	if (index(inc, "/") == 0)
		next                     # a header of its own folder
	to = inc
	sub(/\/.*$/, "", to)
	if (to == dir)
		next
	if (!(to in floor_of)) {
		printf "%s:%d: includes \"%s\" from %s/, which is no floor\n", FILENAME, FNR, inc, to
		bad++
	} else if (floor_of[to] >= floor_of[dir]) {
		printf "%s:%d: %s/ includes \"%s\" from %s/, %s\n", FILENAME, FNR, dir, inc, to,
		       floor_of[to] == floor_of[dir] ? "beside it" : "a floor above it"
		bad++
	}
}
END { exit bad > 0 }
' $(for d in $(echo "$floors" | tr '|' ' '); do
	find "$d" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | sort
done)
rc=$?
if [ $rc -eq 0 ]; then
	echo "floors: every include points down ($floors)"
	echo "1 passed, 0 failed"
else
	echo "0 passed, 1 failed"
fi
exit $rc
