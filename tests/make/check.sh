#!/usr/bin/env bash
# tests/make/check.sh - the Makefile keeps its own flags when a
# user passes CFLAGS, CPPFLAGS or LDFLAGS, and rebuilds the one object that
# holds the git revision when HEAD (or VERSION) changes.
set -u
cd "$(dirname "$0")/../.."
build=build/makefile-check
fail=0
say() { echo "make-check: $*"; }

compile=$(make -n -B BUILD=$build CFLAGS=-O0 CPPFLAGS=-DUSER_FLAG LDFLAGS=-Wl,-O1 \
	$build/obj/common/log.o 2>/dev/null | grep -- '-c common/log.c')
for want in -std=c11 -Werror -Wall -MMD -MP -pthread -D_GNU_SOURCE -DUSER_FLAG -O0; do
	case " $compile " in
	*" $want "*) ;;
	*) say "CFLAGS=-O0 drops $want: $compile"; fail=1 ;;
	esac
done
# the user's -O0 comes after the project's -O2, so it wins
pos2=$(awk -v s="$compile" 'BEGIN { print index(s, " -O2 ") }')
pos0=$(awk -v s="$compile" 'BEGIN { print index(s, " -O0 ") }')
if [ "$pos0" -le "$pos2" ]; then
	say "the user's -O0 does not come after the project's -O2: $compile"
	fail=1
fi

link=$(make -n -B BUILD=$build LDFLAGS=-Wl,-O1 $build/tstaged 2>/dev/null | grep -- '-o '"$build"'/tstaged')
case " $link " in
*" -pthread "*"-Wl,-O1 "*) ;;
*) say "LDFLAGS=-Wl,-O1 drops -pthread or comes first: $link"; fail=1 ;;
esac

# a stale stamp (as after a commit) rebuilds common/version.o, and only it
mkdir -p $build
make -s BUILD=$build $build/version.stamp >/dev/null 2>&1
echo "0.0.0 stale" >$build/version.stamp
rebuilt=$(make -n BUILD=$build $build/obj/common/version.o 2>/dev/null | grep -c -- '-c common/version.c')
if [ "$rebuilt" -ne 1 ]; then
	say "a changed revision does not rebuild common/version.o"
	fail=1
fi
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! make -n BUILD=$build $build/obj/common/version.o 2>/dev/null | grep -q -- "TS_GIT_REV='\"$rev\"'"; then
	say "common/version.o is not built with revision $rev"
	fail=1
fi
others=$(make -n -B BUILD=$build $build/obj/server/config.o 2>/dev/null | grep -c TS_GIT_REV)
if [ "$others" -ne 0 ]; then
	say "the revision reaches objects other than common/version.o"
	fail=1
fi
rm -rf $build
if [ $fail -eq 0 ]; then
	say "ok"
	echo "1 passed, 0 failed"
else
	echo "0 passed, 1 failed"
fi
exit $fail
