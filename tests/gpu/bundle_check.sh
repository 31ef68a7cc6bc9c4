#!/usr/bin/env bash
# Checks a gpu-bundle tarball (make gpu-bundle) as a bare machine with a
# driver would load it: unpacked into an empty folder, every binary's
# loader check (ld.so --list) with only the bundle's lib/ (and lib/compat
# where the system has no libstdc++) on the library path. Fails when the
# bundle ships a part of glibc or a libstdc++ outside lib/compat, when a
# library is not found (the CUDA driver, runtime, cuBLAS and NCCL excepted:
# the machine's), and when a library would come from this system although a
# bare one has only its libc. Usage: tests/gpu/bundle_check.sh BUNDLE.tar.gz
set -eu
tarball=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -C "$tmp" -xzf "$tarball"
root=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -1)
ldso=
for l in /lib64/ld-linux-*.so.* /lib/ld-linux-*.so.* /lib/*/ld-linux-*.so.*; do
	[ -x "$l" ] && ldso=$l && break
done
if [ -z "$ldso" ]; then
	echo "bundle_check: no dynamic loader (ld-linux) on this system" >&2
	exit 1
fi
glibc='^(libc|libm|libpthread|libdl|librt|libresolv|libnss_[a-z]*|libutil|libanl|libBrokenLocale|libmvec|libthread_db)\.so|^ld-linux'
cuda='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z]*)\.so'
status=0

# what the bundle ships
for f in "$root"/lib/*.so*; do
	[ -e "$f" ] || continue
	n=$(basename "$f")
	if [[ $n =~ $glibc ]]; then
		echo "bundle_check: ships glibc's $n (it must be the system's)" >&2
		status=1
	fi
	if [[ $n =~ ^(libstdc\+\+|libgcc_s)\.so ]]; then
		echo "bundle_check: $n in lib/ would shadow the system's (lib/compat only)" >&2
		status=1
	fi
done

libpath=$root/lib
if ! ldconfig -p 2>/dev/null | grep 'libstdc++\.so\.6 ' >/dev/null; then
	libpath=$libpath:$root/lib/compat
fi
n=0
for f in "$root"/bin/* "$root"/tests/test_* "$root"/tests/it_* "$root"/bench/bench_*; do
	[ -f "$f" ] && [ -x "$f" ] || continue
	head -c 4 "$f" | grep -q 'ELF' || continue
	n=$((n + 1))
	out=$(env -i "$ldso" --inhibit-cache --library-path "$libpath" --list "$f" 2>&1) || {
		echo "bundle_check: $(basename "$f"): the loader refuses it: $out" >&2
		status=1
		continue
	}
	while read -r name arrow path _; do
		[ "$arrow" = "=>" ] || continue
		if [ "$path" = "not" ]; then
			[[ $name =~ $cuda ]] && continue
			echo "bundle_check: $(basename "$f"): $name not found" >&2
			status=1
		elif [[ $path != "$root"/* ]] && ! [[ $name =~ $glibc ]] && ! [[ $name =~ $cuda ]] &&
			! [[ $name =~ ^(libstdc\+\+|libgcc_s)\.so ]]; then
			echo "bundle_check: $(basename "$f"): $name comes from this system ($path)," \
				"not the bundle" >&2
			status=1
		fi
	done <<<"$out"
done
if [ "$n" -eq 0 ]; then
	echo "bundle_check: no binaries in $tarball" >&2
	status=1
fi
[ $status -eq 0 ] && echo "bundle_check: $n binaries load with only the bundle and the system's libc"
exit $status
