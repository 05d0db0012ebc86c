#!/usr/bin/env bash
# scripts/gpu-pack.sh — builds the CUDA check's programs here and packs them, with the shared
# libraries they need that a CUDA machine may lack, into .gpu-pack/ (ignored by git), for a GPU
# machine with the CUDA toolkit but no package registry or no time to build.
# scripts/gpu-check.sh runs the packed programs when the folder is there (and builds otherwise).
#
# Needs a CUDA toolkit here (nvcc; no GPU) of the same major version as the GPU machine's, and
# retrace's build dependencies (scripts/setup.sh). The CUDA runtime, cuBLAS and NCCL are not packed:
# the GPU machine's toolkit provides them. Environment: RETRACE_GPU_BUILD_DIR (default
# build-gpu), CMAKE_CUDA_ARCHITECTURES (default "90-real;75-virtual").
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RETRACE_GPU_BUILD_DIR:-$root/build-gpu}
archs=${CMAKE_CUDA_ARCHITECTURES:-90-real;75-virtual}
pack="$root/.gpu-pack"
programs=(retrace_test_conformance retrace_test_ops retrace_test_tracer
  retrace_test_traced_function retrace_test_lifetimes retrace_test_mesh_cuda retrace
  retrace_bench_cuda
  retrace_example_readme_cuda)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DRETRACE_WITH_CUDA=ON -DRETRACE_WITH_LIBTORCH=OFF \
  -DRETRACE_WITH_MPI=OFF -DRETRACE_BUILD_EXAMPLES=ON >/dev/null
targets=()
for p in "${programs[@]}"; do  # the command line's target is retrace_cli (its program: retrace)
  if [[ $p == retrace ]]; then targets+=(retrace_cli); else targets+=("$p"); fi
done
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

rm -rf "$pack"
mkdir -p "$pack/stage/bin" "$pack/stage/lib"
for p in "${programs[@]}"; do
  cp "$build/bin/$p" "$pack/stage/bin/"
  strip --strip-unneeded "$pack/stage/bin/$p"
done
# Every library the programs load that is neither the C library's nor the CUDA toolkit's.
for p in "${programs[@]}"; do ldd "$build/bin/$p"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so* | \
        libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so*) ;;
      *) cp -L "$lib" "$pack/stage/lib/" ;;
    esac
  done
tar -C "$pack/stage" -cf - bin lib | xz -T0 -6 >"$pack/payload.tar.xz"
rm -rf "$pack/stage"
git -C "$root" rev-parse HEAD >"$pack/commit" 2>/dev/null || true
du -sh "$pack"
