#!/usr/bin/env bash
# scripts/gpu-check.sh OUT_DIR — the CUDA backend's check on a machine with an NVIDIA GPU.
#
# Builds retrace with the CUDA backend (sm_90 machine code plus PTX), runs the CUDA conformance,
# op, tracer and traced-function tests on the GPU (a skipped test is a failure here: the GPU is
# supposed to be usable), runs `retrace demo --device cuda`, and runs retrace_bench_cuda (eager vs
# traced vs a hand-written CUDA graph, per step). Writes into OUT_DIR:
#   gpu.txt          nvidia-smi's view of the GPU
#   tests.txt        the test programs' output;   tests-*.json  GoogleTest's JSON reports
#   demo.txt         the demo's output
#   bench_cuda.json  the benchmark's figures;     bench.txt     its table
#   example.txt      the CUDA example's output (examples/readme_cuda.cpp, shown in docs/cuda.md)
#   memcheck.txt, racecheck.txt, synccheck.txt   compute-sanitizer's logs
#   ncu.txt          with RETRACE_GPU_PROFILE=1: Nsight Compute's per-kernel GPU times of a step
#   summary.txt      one line per stage, PASS or FAIL
# Exits non-zero if any stage failed. About 3 minutes on an H200 machine with 16 cores with
# packed programs (racecheck is most of it), plus the build otherwise.
#
# Programs: those scripts/gpu-pack.sh built elsewhere and packed into .gpu-pack/ (with the
# libraries they need besides the CUDA toolkit's), when that folder is there and they load here;
# otherwise built here. Building needs the machine's own packages (scripts/setup.sh installs
# missing ones through apt-get unless RETRACE_SKIP_SETUP=1), or, on a machine without a package
# registry, the Debian packages scripts/gpu-deps.sh put into .gpu-deps/ beforehand (unpacked
# into a private prefix). Where compute-sanitizer is found, the suites run once more under its
# memcheck tool, and the op and conformance suites under racecheck and synccheck
# (RETRACE_GPU_SANITIZE=0 skips these stages).
# Environment: RETRACE_GPU_BUILD_DIR (default build-gpu), CMAKE_CUDA_ARCHITECTURES (default
# "90-real;75-virtual").
set -uo pipefail

out=${1:?usage: scripts/gpu-check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RETRACE_GPU_BUILD_DIR:-$root/build-gpu}
archs=${CMAKE_CUDA_ARCHITECTURES:-90-real;75-virtual}
jobs=$(nproc)
status=0
: >"$out/summary.txt"

stage() {  # stage NAME COMMAND...: runs a stage, records PASS/FAIL with its time
  local name=$1
  shift
  local t0=$SECONDS
  if "$@"; then
    echo "PASS $name ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
  else
    echo "FAIL $name ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
    status=1
    return 1
  fi
}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
    | tee "$out/gpu.txt"
else
  echo "gpu-check: nvidia-smi not found; is this a machine with an NVIDIA GPU?" | tee "$out/gpu.txt"
fi

# The CUDA runtime and cuBLAS of the machine's toolkit, wherever its layout put them.
cuda_libs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
    compgen -G "$d/libcublas.so*" >/dev/null && printf '%s:' "$d"
  done
}
export LD_LIBRARY_PATH="$(cuda_libs)${LD_LIBRARY_PATH:-}"

bin=""
if [[ -f "$root/.gpu-pack/payload.tar.xz" ]]; then
  packed=${TMPDIR:-/tmp}/retrace-gpu-pack
  rm -rf "$packed" && mkdir -p "$packed"
  if xz -dc "$root/.gpu-pack/payload.tar.xz" | tar -C "$packed" -xf -; then
    missing=$(LD_LIBRARY_PATH="$packed/lib:$LD_LIBRARY_PATH" ldd "$packed"/bin/* 2>&1 | grep "not found" | sort -u)
    if [[ -z "$missing" ]]; then
      bin="$packed/bin"
      head=$(git -C "$root" rev-parse HEAD 2>/dev/null || true)
      if [[ -n "$head" && "$head" != "$(cat "$root/.gpu-pack/commit" 2>/dev/null)" ]]; then
        echo "gpu-check: warning: .gpu-pack was built from another commit than $head (run scripts/gpu-pack.sh again)" \
          | tee -a "$out/summary.txt"
      fi
      export LD_LIBRARY_PATH="$packed/lib:$LD_LIBRARY_PATH"
      echo "gpu-check: running the programs packed in .gpu-pack (commit $(cat "$root/.gpu-pack/commit" 2>/dev/null))" \
        | tee -a "$out/summary.txt"
    else
      echo "gpu-check: the packed programs do not load here, building instead:"; echo "$missing"
    fi
  fi
fi

cmake_extra=()
if [[ -n "$bin" ]]; then
  :
elif compgen -G "$root/.gpu-deps/*.deb" >/dev/null; then
  # Packages brought along by scripts/gpu-deps.sh: unpacked into a private prefix, never into /.
  deps=${TMPDIR:-/tmp}/retrace-gpu-deps
  mkdir -p "$deps"
  for deb in "$root"/.gpu-deps/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$deps"
    else
      (cd "$deps" && ar p "$deb" data.tar.xz | tar -xJ)
    fi
  done
  lib="$deps/usr/lib/x86_64-linux-gnu"
  cmake_extra=("-DCMAKE_PREFIX_PATH=$deps/usr"
    "-DRETRACE_OPENBLAS_LIBRARY=$lib/openblas-pthread/libopenblas.so"
    "-DRETRACE_CBLAS_INCLUDE_DIR=$deps/usr/include/x86_64-linux-gnu/openblas-pthread")
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu-check: using the packages in .gpu-deps (unpacked into $deps)"
elif [[ "${RETRACE_SKIP_SETUP:-0}" != 1 ]] && command -v apt-get >/dev/null; then
  "$root/scripts/setup.sh" || echo "gpu-check: setup.sh failed; building with what is installed"
fi

configure() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DRETRACE_WITH_CUDA=ON -DRETRACE_WITH_LIBTORCH=OFF \
    -DRETRACE_BUILD_EXAMPLES=OFF "${cmake_extra[@]}" >"$out/configure.txt" 2>&1 || { cat "$out/configure.txt"; return 1; }
  grep -q "CUDA backend enabled" "$out/configure.txt" || {
    echo "gpu-check: CMake did not enable the CUDA backend:"; grep -i cuda "$out/configure.txt"
    return 1
  }
}
build_targets() {
  cmake --build "$build" -j "$jobs" --target retrace_cuda retrace_test_conformance \
    retrace_test_ops retrace_test_tracer retrace_test_traced_function retrace_test_lifetimes \
    retrace_test_mesh_cuda retrace_cli retrace_bench_cuda 2>&1 | tail -n 30
}
if [[ -z "$bin" ]]; then
  stage configure configure || { cat "$out/summary.txt"; exit 1; }
  stage build build_targets || { cat "$out/summary.txt"; exit 1; }
  bin="$build/bin"
fi

suites=(conformance ops tracer traced_function lifetimes mesh_cuda)
run_tests() {  # the programs side by side (one CUDA context each); a case skipped for want of a GPU fails
  local ok=0 name filter log
  local -a pids=()
  for name in "${suites[@]}"; do
    filter='*'
    [[ $name == conformance ]] && filter='*/cuda'
    RETRACE_TEST_BACKEND=cuda timeout "${RETRACE_GPU_TEST_TIMEOUT:-300}" \
      "$bin/retrace_test_$name" "--gtest_filter=$filter" \
      "--gtest_output=json:$out/tests-$name.json" >"$out/tests-$name.txt" 2>&1 &
    pids+=($!)
  done
  local i
  for i in "${!suites[@]}"; do
    name=${suites[$i]}
    log="$out/tests-$name.txt"
    local rc=0
    wait "${pids[$i]}" || rc=$?
    if ((rc == 124)); then echo "$name: timed out"; fi
    if ((rc != 0)); then ok=1; echo "$name: exit status $rc"; fi
    grep -E '^\[  (PASSED|FAILED) +\]|^\[  SKIPPED \] [0-9]+ test|^\[==========\]' "$log" \
      | sed "s/^/$name: /"
    # Cases that do not apply to the GPU (guard bytes, CPU options) skip with their reason;
    # a skip because the CUDA backend is missing or unusable is a failure here.
    if grep -qE "cannot be used here|built without the cuda backend" "$log"; then
      echo "$name: cases were skipped on a GPU machine:"
      grep -m1 -E "cannot be used here|built without the cuda backend" "$log"
      ok=1
    fi
  done
  for name in "${suites[@]}"; do  # the failures, for the reply's tail
    grep -E '^\[  FAILED  \]' "$out/tests-$name.txt" | sort -u | head -n 25 | sed "s/^/$name: /"
  done
  cat "$out"/tests-*.txt >"$out/tests.txt"
  rm -f "$out"/tests-*.txt
  return $ok
}
stage tests run_tests || true

run_demo() {
  timeout 300 "$bin/retrace" demo --device cuda 2>&1 | tee "$out/demo.txt"
}
stage demo run_demo || true

run_bench() {
  timeout 300 "$bin/retrace_bench_cuda" --json "$out/bench_cuda.json" 2>&1 | tee "$out/bench.txt"
}
stage bench run_bench || true

run_example() {
  timeout 60 "$bin/retrace_example_readme_cuda" 2>&1 | tee "$out/example.txt"
}
if [[ -x "$bin/retrace_example_readme_cuda" ]]; then stage example run_example || true; fi

sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
# sanitize TOOL SUITE...: the suites side by side under compute-sanitizer's TOOL.
sanitize() {
  local tool=$1 ok=0 name filter rc
  shift
  local -a names=("$@") pids=()
  for name in "${names[@]}"; do
    filter='*'
    [[ $name == conformance ]] && filter='*/cuda'
    RETRACE_TEST_BACKEND=cuda timeout "${RETRACE_GPU_SANITIZER_TIMEOUT:-300}" "$sanitizer" \
      --tool "$tool" --error-exitcode 9 "$bin/retrace_test_$name" "--gtest_filter=$filter" \
      >"$out/$tool-$name.txt" 2>&1 &
    pids+=($!)
  done
  local i
  for i in "${!names[@]}"; do
    name=${names[$i]}
    rc=0
    wait "${pids[$i]}" || rc=$?
    if ((rc != 0)); then ok=1; echo "$name under $tool: exit status $rc (9: errors found, 124: timed out)"; fi
    grep -E '^\[  (PASSED|FAILED) +\]|ERROR SUMMARY' "$out/$tool-$name.txt" | sed "s/^/$name: /"
    grep -m 20 -E '^========= (Invalid|Race|Uninitialized|Barrier|Program hit)' "$out/$tool-$name.txt" \
      | sed "s/^/$name: /"
  done
  cat "$out/$tool"-*.txt >"$out/$tool.txt"
  rm -f "$out/$tool"-*.txt
  return $ok
}
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -n "$sanitizer" && "${RETRACE_GPU_SANITIZE:-1}" == 1 ]]; then
  stage memcheck sanitize memcheck "${suites[@]}" || true
  # Shared-memory races in the row kernels (softmax, norms, reductions), and barrier misuse
  # (RETRACE_GPU_RACECHECK=0 skips these two, most of the sanitizers' time).
  if [[ "${RETRACE_GPU_RACECHECK:-1}" == 1 ]]; then
    stage racecheck sanitize racecheck ops conformance || true
    stage synccheck sanitize synccheck ops || true
  fi
fi

# RETRACE_GPU_PROFILE=1: Nsight Compute's per-kernel summary (GPU time of each kernel) of
# `retrace inspect --device cuda` (the demo's model: one eager step, its capture and a replay),
# into ncu.txt. One pass per kernel (only the duration is collected): a minute or so.
run_profile() {
  timeout "${RETRACE_GPU_PROFILE_TIMEOUT:-300}" "$ncu" --clock-control none \
    --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$bin/retrace" inspect --device cuda >"$out/ncu.txt" 2>&1
  local rc=$?
  grep -E "^  [^ ].*\(|gpu__time_duration" "$out/ncu.txt" | head -n 80
  return $rc
}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [[ -n "$ncu" && "${RETRACE_GPU_PROFILE:-0}" == 1 ]]; then stage profile run_profile || true; fi

echo "gpu-check: results in $out"
cat "$out/summary.txt"
exit $status
