# The two commands of the README: `make demo` (the main job) and `make test` (the whole suite).
# Both install missing Debian packages first (scripts/setup.sh) and build what they need.
JOBS ?= $(shell nproc)

.PHONY: all setup build demo test test-release test-python python demo-python test-asan test-tsan bench clean

all: build

setup:
	@scripts/setup.sh

build: setup
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

demo: build
	./build/bin/retrace demo

test: test-release test-python test-asan test-tsan

test-release: build
	ctest --preset default -j $(JOBS)

# The Python package, built by pip (scikit-build-core + nanobind) into the project's virtual
# environment (.venv, made by scripts/python-env.sh); its build tree is build-python/. Without
# the CUDA backend here, to keep `make test` quick (the C++ build has it); a plain
# `pip install .` includes it when a CUDA toolkit is found.
PYTHON := .venv/bin/python
python: setup
	scripts/python-env.sh
	$(PYTHON) -m pip install -q --no-build-isolation -C cmake.define.RETRACE_WITH_CUDA=OFF .

test-python: python
	cd python/tests && ../../$(PYTHON) -m pytest -q

demo-python: python
	$(PYTHON) -m retrace.demo

test-asan: setup
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

test-tsan: setup
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan -j $(JOBS)

bench:
	@scripts/setup.sh --bench
	$(MAKE) build
	./build/bin/retrace bench --json build/bench.json --plot build/bench.png
	./build/bin/retrace_bench_device
	./build/bin/retrace_bench_ops
	./build/bin/retrace_bench_tracer
	./build/bin/retrace_bench_mesh
	$(MAKE) python
	$(PYTHON) bench/python/call_overhead.py --json build/bench_python_calls.json

clean:
	rm -rf build build-debug build-asan build-tsan build-python
