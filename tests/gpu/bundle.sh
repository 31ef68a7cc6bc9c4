#!/usr/bin/env bash
# Builds a self-contained folder for a CUDA machine that has no package
# registry: tstaged, the unit and integration test binaries, the bench
# binaries, the non-CUDA shared libraries they load (the CUDA runtime and
# cuBLAS come with the machine's CUDA installation, the driver and the C
# library with the system), and run.sh. Usage: tests/gpu/bundle.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$1
out=$2
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/bench" "$out/lib"
cp "$build/tstaged" "$out/bin/"
for f in "$build"/tests/test_* "$build"/tests/it_* "$build"/bench/bench_*; do
	case "$f" in
	*.d) ;;
	*/tests/*) [ -x "$f" ] && cp "$f" "$out/tests/" ;;
	*) [ -x "$f" ] && cp "$f" "$out/bench/" ;;
	esac
done
cp -r tests/integration/py "$out/tests/py"
cp tests/bench/run.sh "$out/bench/run.sh"
cp tests/gpu/run.sh "$out/run.sh"
# every library any binary needs, except the kernel driver's and glibc's
for f in "$out"/bin/* "$out"/tests/* "$out"/bench/bench_*; do
	ldd "$f" 2>/dev/null | awk '/=> \//{print $3}' || true
done | sort -u | while read -r lib; do
	case "$(basename "$lib")" in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda.so* | \
	libcudart.so* | libcublas*.so* | libnvidia*) ;;
	*) cp -L "$lib" "$out/lib/" ;;
	esac
done
# no debug sections: the folder must stay small enough to carry
strip --strip-debug "$out"/bin/* "$out"/tests/test_* "$out"/tests/it_* "$out"/bench/bench_* \
	"$out"/lib/*.so* 2>/dev/null || true
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "gpu-bundle: $(du -sh "$out" | cut -f1) in $out, $(du -sh "$out.tar.gz" | cut -f1) as $out.tar.gz"
