# The two commands of the README: `make demo` (the main job) and `make test` (the whole suite).
# Both install missing Debian packages first (scripts/setup.sh) and build what they need.
JOBS ?= $(shell nproc)

.PHONY: all setup build demo test test-release test-asan test-tsan bench clean

all: build

setup:
	@scripts/setup.sh

build: setup
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

demo: build
	./build/bin/retrace demo

test: test-release test-asan test-tsan

test-release: build
	ctest --preset default -j $(JOBS)

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

clean:
	rm -rf build build-debug build-asan build-tsan
