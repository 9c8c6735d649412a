# The two README commands: `make run` and `make test`. Each installs what is missing
# (Debian packages, as root), configures, builds with -j2, then runs.
BUILD_DIR ?= build
JOBS ?= 2
PIPECHECK := $(BUILD_DIR)/pipecheck

.PHONY: all deps configure build run test test-long bench clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	$(PIPECHECK) run --scenarios scenarios/core.csv

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) -LE long

# The long sweeps: 50 seeds of the core suite, long and high-lr runs (scenarios/long.csv).
test-long: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) -L long

bench: build
	$(BUILD_DIR)/benchmarks/bench_reference --benchmark_min_time=2
	$(BUILD_DIR)/benchmarks/bench_pipeline --benchmark_min_time=1
	$(PIPECHECK) run --scenarios benchmarks/pipeline_2ranks.csv --threads 1 --out $(BUILD_DIR)/bench-2ranks

clean:
	rm -rf $(BUILD_DIR)
