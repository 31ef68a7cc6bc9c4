#!/usr/bin/env bash
# Builds a self-contained folder for a CUDA machine that has no package
# registry: tstaged, the unit and integration test binaries, the bench
# binaries, the shared libraries they load (all but the driver and the C
# library), and run.sh. Usage: tests/gpu/bundle.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$1
out=$2
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/bench" "$out/lib"
cp "$build/tstaged" "$out/bin/"
cp "$build"/tests/test_* "$build"/tests/it_* "$out/tests/" 2>/dev/null || true
cp "$build"/bench/bench_* "$out/bench/" 2>/dev/null || true
cp tests/bench/run.sh "$out/bench/run.sh"
cp tests/gpu/run.sh "$out/run.sh"
# every library any binary needs, except the kernel driver's and glibc's
for f in "$out"/bin/* "$out"/tests/* "$out"/bench/bench_*; do
	ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
	case "$(basename "$lib")" in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda.so* | libnvidia*) ;;
	*) cp -L "$lib" "$out/lib/" ;;
	esac
done
du -sh "$out" | awk '{print "gpu-bundle: " $1 " in '"$out"'"}'
