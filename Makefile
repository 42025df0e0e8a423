# Thin wrapper over CMake. The two contract commands (README.md):
#   make run    build everything (installing missing Debian packages when root), then run fp4doctor
#   make test   build and run the tests
BUILD   ?= build
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
FP4DOCTOR_ARGS ?=

.PHONY: all deps configure build run test test-quick bench install clean asan

all: build

deps:
	@sh tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/fp4doctor $(FP4DOCTOR_ARGS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Everything but the exhaustive 2^32 codec sweeps.
test-quick: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE exhaustive

bench: build
	@set -e; for b in $(BUILD)/bench/fp4d_bench_*; do [ -x "$$b" ] && "$$b"; done

# The tests (all but the exhaustive sweeps) under AddressSanitizer + UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B build-asan -DFP4D_SANITIZE=ON -DFP4D_CUDA=OFF -DFP4D_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -j $(JOBS) -LE exhaustive

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) build-asan
