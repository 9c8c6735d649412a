# The two README commands: `make run` and `make test`. Each installs what is missing
# (Debian packages, as root), configures, builds with -j2, then runs.
#
# Which LibTorch: TORCH=auto (default) builds against the CUDA PyTorch of `python3` when it has
# one (torch.cuda.is_available()), else Debian's LibTorch; TORCH=debian, TORCH=python (python3's
# torch, CUDA or not) or TORCH=/some/prefix choose. NO_INSTALL=1 skips the package step (deps
# from a Conda env, Spack, an unpacked bundle); PREFIX_PATH="a;b" is added to CMake's search
# path. A build directory remembers the LibTorch it was configured with: switching needs another
# BUILD_DIR or `make clean`.
BUILD_DIR ?= build
JOBS ?= 2
TORCH ?= auto
NO_INSTALL ?= 0
PREFIX_PATH ?=
# Further arguments for `make run`, e.g. RUN_ARGS="--runner NAME --junit FILE --markdown FILE" in CI.
RUN_ARGS ?=
PIPECHECK := $(BUILD_DIR)/pipecheck

.PHONY: all deps configure build run test test-long bench clean

all: build

deps:
	@if [ "$(NO_INSTALL)" = 1 ]; then echo "deps: NO_INSTALL=1, package step skipped"; \
	else torch="$$(scripts/torch-prefix.sh $(TORCH))" || exit 2; PIPECHECK_TORCH="$$torch" scripts/install-deps.sh; fi

$(BUILD_DIR)/CMakeCache.txt:
	@torch_prefix="$$(scripts/torch-prefix.sh $(TORCH))" || exit 2; \
	prefix="$(PREFIX_PATH)"; \
	if [ "$$torch_prefix" != debian ]; then prefix="$$torch_prefix$${prefix:+;$$prefix}"; fi; \
	echo "configure: LibTorch $$torch_prefix$${prefix:+ (CMAKE_PREFIX_PATH=$$prefix)}"; \
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $${prefix:+"-DCMAKE_PREFIX_PATH=$$prefix"}

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	$(PIPECHECK) run --scenarios scenarios/core.csv $(RUN_ARGS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) -LE long

# The long sweeps: 50 seeds of the core suite, long and high-lr runs (scenarios/long.csv), and the
# timed baseline loop (tests/baseline_loop_test.py).
test-long: build
	cmake --build $(BUILD_DIR) -j$(JOBS) --target pipecheck_long_tests
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) -L long

bench: build
	cmake --build $(BUILD_DIR) -j$(JOBS) --target bench_reference bench_pipeline
	$(BUILD_DIR)/benchmarks/bench_reference --benchmark_min_time=2
	$(BUILD_DIR)/benchmarks/bench_pipeline --benchmark_min_time=1
	$(PIPECHECK) run --scenarios benchmarks/pipeline_2ranks.csv --threads 1 --out $(BUILD_DIR)/bench-2ranks

clean:
	rm -rf $(BUILD_DIR)
