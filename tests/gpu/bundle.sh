#!/usr/bin/env bash
# Builds a self-contained folder for a CUDA machine that has no package
# registry: tstaged, the unit and integration test binaries, the bench
# binaries, the shared libraries they load that a bare system with a driver
# may lack, and run.sh. Usage: tests/gpu/bundle.sh BUILD_DIR OUT_DIR
#
# Never shipped: glibc's own parts (libc, libm, libpthread, libdl, librt,
# libresolv, libnss_*, libutil, libanl, ld-linux: they must match the
# system's libc), the kernel driver's libraries (libcuda, libnvidia-*), and
# the CUDA runtime, cuBLAS and NCCL (the machine's CUDA installation, or
# the NVIDIA wheels of its Python, found by run.sh; NCCL alone is 190 MB). libstdc++ and libgcc_s go to lib/compat, which run.sh adds only
# where the system has none: an older copy must never shadow the system's.
# tests/gpu/bundle_check.sh checks the result.
set -euo pipefail
build=$1
out=$2
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/bench" "$out/lib/compat"
cp "$build/tstaged" "$out/bin/"
for f in "$build"/tests/test_* "$build"/tests/it_* "$build"/bench/bench_*; do
	case "$f" in
	*.d) ;;
	# the fault walk needs the FAULT=1 daemon (make faults), not this one
	*/tests/it_faults) ;;
	*/tests/*) [ -x "$f" ] && cp "$f" "$out/tests/" ;;
	*) [ -x "$f" ] && cp "$f" "$out/bench/" ;;
	esac
done
cp -r tests/integration/py "$out/tests/py"
# the suites read tests/data/ from the folder they run in (run.sh's)
cp -r tests/data "$out/tests/data"
cp tests/bench/run.sh "$out/bench/run.sh"
cp tests/gpu/run.sh "$out/run.sh"
cp tests/gpu/bundle_check.sh "$out/bundle_check.sh"
# every library any binary needs, but the system's own
for f in "$out"/bin/* "$out"/tests/test_* "$out"/tests/it_* "$out"/bench/bench_*; do
	ldd "$f" 2>/dev/null | awk '/=> \//{print $3}' || true
done | sort -u | while read -r lib; do
	case "$(basename "$lib")" in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so* | \
	libnss_*.so* | libutil.so* | libanl.so* | libBrokenLocale.so* | libmvec.so* | \
	libthread_db.so* | ld-linux* | \
	libcuda.so* | libcudart.so* | libcublas*.so* | libnccl.so* | libnvidia*) ;;
	libstdc++.so* | libgcc_s.so*) cp -L "$lib" "$out/lib/compat/" ;;
	*) cp -L "$lib" "$out/lib/" ;;
	esac
done
# no debug sections: the folder must stay small enough to carry
strip --strip-debug "$out"/bin/* "$out"/tests/test_* "$out"/tests/it_* "$out"/bench/bench_* \
	"$out"/lib/*.so* "$out"/lib/compat/*.so* 2>/dev/null || true
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "gpu-bundle: $(du -sh "$out" | cut -f1) in $out, $(du -sh "$out.tar.gz" | cut -f1) as $out.tar.gz"
