# The two commands of the README: `make demo` (the main job) and `make test` (the whole suite).
# Both install missing Debian packages first (scripts/setup.sh) and build what they need.
JOBS ?= $(shell nproc)

.PHONY: all setup build cli demo test test-release test-python python demo-python test-asan test-tsan bench clean

all: build

setup:
	@scripts/setup.sh

build: setup
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

# The demo needs the CLI and the libraries it links, not the test suite.
cli: setup
	cmake --preset default
	cmake --build --preset default -j $(JOBS) --target retrace_cli

demo: cli
	./build/bin/retrace demo

test: test-release test-python test-asan test-tsan

test-release: build
	ctest --preset default -j $(JOBS)

# The Python package, built by pip (scikit-build-core + nanobind) into the project's virtual
# environment (.venv, made by scripts/python-env.sh); its build tree is build-python/. Without
# the CUDA backend and the AVX-512 kernel variant here, to keep `make test` quick (the C++ build
# has both); a plain `pip install .` includes them (CUDA when a toolkit is found).
PYTHON := .venv/bin/python
# The kernel variants of the quicker test builds (x86-64: the baseline and AVX2; elsewhere the
# one generic variant).
ifeq ($(shell uname -m),x86_64)
QUICK_VARIANTS := x86-64=x86-64;avx2=x86-64-v3
else
QUICK_VARIANTS := generic=
endif
python: setup
	scripts/python-env.sh
	$(PYTHON) -m pip install -q --no-build-isolation -C cmake.define.RETRACE_WITH_CUDA=OFF \
	  -C "cmake.define.RETRACE_CPU_VARIANTS=$(QUICK_VARIANTS)" .

test-python: python
	cd python/tests && ../../$(PYTHON) -m pytest -q

demo-python: python
	$(PYTHON) -m retrace.demo

# The sanitizer presets keep line tables only (-g1: file:line in every report, inlined frames
# included) and compress them (-gz): full debug info made the ASan tree ~3 GB.
test-asan: setup
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

# ThreadSanitizer runs the tests labelled "threads" (queues, events, tracer caches, meshes): the
# build makes only what they run, and one kernel variant besides the baseline.
test-tsan: setup
	cmake --preset tsan "-DRETRACE_CPU_VARIANTS=$(QUICK_VARIANTS)"
	cmake --build --preset tsan -j $(JOBS) --target retrace_threads_tests
	ctest --preset tsan -j $(JOBS)

# `make bench LOAD=2` also measures every cell beside 2 busy processes (retrace bench --load).
LOAD ?= 0
# Image sizes of the VAE decode row (a traced 512x512 decode takes about 7 s on 2 cores).
DECODE_SIZES ?= 256,512
bench:
	@scripts/setup.sh --bench
	$(MAKE) build
	./build/bin/retrace bench --load $(LOAD) --decode $(DECODE_SIZES) --json build/bench.json \
	  --plot build/bench.png
	@# The peers (ONNX Runtime, torch.compile) on the same steps and weights, added to bench.json.
	./build/bin/retrace bench --export-steps build/peers
	@if scripts/peers-env.sh; then \
	  .venv-peers/bin/python bench/python/peers.py --steps-dir build/peers \
	    --bench-json build/bench.json --plot build/bench_peers.png; \
	else echo "make bench: peers skipped (ONNX Runtime / PyTorch could not be installed from PyPI)"; fi
	@# The VAE decode: retrace decode against diffusers' decoder (eager, torch.compile, ONNX Runtime).
	@if scripts/peers-env.sh > /dev/null; then \
	  .venv-peers/bin/python bench/python/decode_peers.py --retrace build/bin/retrace \
	    --workdir build/decode --json build/bench_decode.json --sizes $(DECODE_SIZES) \
	    --bench-json build/bench.json; \
	else echo "make bench: the decode's peers skipped (PyTorch / diffusers could not be installed)"; fi
	./build/bin/retrace_bench_device
	./build/bin/retrace_bench_ops
	./build/bin/retrace_bench_tracer
	./build/bin/retrace_bench_mesh
	@if [ -x build/bin/retrace_bench_mpi ]; then \
	  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	  mpirun -np 2 --bind-to none ./build/bin/retrace_bench_mpi; fi
	$(MAKE) python
	$(PYTHON) bench/python/call_overhead.py --json build/bench_python_calls.json

clean:
	rm -rf build build-debug build-asan build-tsan build-python
