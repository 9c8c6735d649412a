# The two README commands: `make run` and `make test`. Each installs what is missing (Debian
# packages as root; PyTorch 2.x into the project's .venv/ from requirements.txt), configures,
# builds with -j2, then runs.
#
# Which PyTorch: TORCH=auto (default) uses the active environment's python3 when it imports torch
# 2.x (a GPU runner's CUDA PyTorch, an activated venv or Conda env) and installs nothing; else the
# project's .venv, installed from requirements.txt (PyPI's CUDA wheel, pinned). TORCH=venv always
# takes .venv; TORCH=/path/to/python takes that interpreter's torch 2.x. pipecheck builds against
# that PyTorch's LibTorch and its tests run that Python. NO_INSTALL=1 skips every install step
# (deps from a Conda env, Spack, an unpacked bundle); PREFIX_PATH="a;b" is added to CMake's
# search path. A build directory remembers the PyTorch it was configured with: switching needs
# another BUILD_DIR or `make clean`.
BUILD_DIR ?= build
JOBS ?= 2
TORCH ?= auto
# The pins of the project's environment: requirements.txt (the newest PyTorch supported, into
# .venv) by default; requirements-oldest.txt (the oldest, into .venv-requirements-oldest) for the
# other end of the tested range (make test-oldest).
REQUIREMENTS ?= requirements.txt
export REQUIREMENTS
NO_INSTALL ?= 0
PREFIX_PATH ?=
# Further arguments for `make run`, e.g. RUN_ARGS="--runner NAME --junit FILE --markdown FILE" in CI.
RUN_ARGS ?=
# SANITIZE=1 configures a new build directory with AddressSanitizer and UndefinedBehaviorSanitizer
# over pipecheck's own code (LibTorch stays uninstrumented), -O1 with line tables, and runs what it
# builds with the reports fatal: CI's second leg is the oldest PyTorch's build, sanitized, so one
# build serves both (make test-oldest SANITIZE=1).
SANITIZE ?= 0
SANITIZE_CMAKE := "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g1 -DNDEBUG" -DPIPECHECK_SANITIZE=address,undefined
SANITIZE_ENV := ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
SANITIZED = $(if $(filter 1,$(SANITIZE)),$(SANITIZE_ENV))
PIPECHECK := $(BUILD_DIR)/pipecheck
# The Python the build was configured with (its torch is the LibTorch pipecheck links).
BUILD_PYTHON = $$(sed -n 's/^PIPECHECK_PYTHON:FILEPATH=//p' $(BUILD_DIR)/CMakeCache.txt)

.PHONY: all deps frameworks configure build run test test-oldest test-long sanitize mutants bench bench-peer clean

all: build

deps:
	@if [ "$(NO_INSTALL)" = 1 ]; then echo "deps: NO_INSTALL=1, install steps skipped"; \
	else scripts/install-deps.sh && python="$$(scripts/torch-python.sh --install $(TORCH))" && \
	  if [ "$$python" = "$(CURDIR)/.venv/bin/python" ]; then scripts/install-frameworks.sh "$$python"; fi; fi

# DeepSpeed and Megatron-Core (requirements-frameworks.txt) into the Python pipecheck builds
# against, whichever it is: `make deps` does it by itself only for the project's .venv.
frameworks:
	@python="$$(scripts/torch-python.sh --install $(TORCH))" && scripts/install-frameworks.sh "$$python"

$(BUILD_DIR)/CMakeCache.txt:
	@python="$$(scripts/torch-python.sh $(TORCH))" || exit 2; \
	echo "configure: PyTorch $$($$python -c 'import torch; print(torch.__version__)' 2>/dev/null) of $$python$(if $(PREFIX_PATH), (CMAKE_PREFIX_PATH=$(PREFIX_PATH)))"; \
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release "-DPIPECHECK_PYTHON=$$python" $(if $(PREFIX_PATH),"-DCMAKE_PREFIX_PATH=$(PREFIX_PATH)") \
	  $(if $(filter 1,$(SANITIZE)),$(SANITIZE_CMAKE))

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The suite needs the binary (and the meter library it depends on), not the test binaries.
run: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target pipecheck
	$(PIPECHECK) run --scenarios scenarios/core.csv $(RUN_ARGS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) -LE 'long|oldest'

# The GoogleTest unit suites (no ranks), for the builds that run them apart from CTest: the
# sanitizer build and the oldest PyTorch's (whose ranks run in the core suite after them).
UNIT_TESTS := 'MaskedSoftmax.*:AttentionCore.*:Linear.*:Rotary.*:RmsNorm.*:Action.*:Interleaved.*:ZeroBubble*:DualPipeV.*:InvarianceMatrix.*:PublishedMakespan.*:ScheduleCsv.*:Schedule.*:Simulator.*:DeviceStreams.*:Compare*:BaselineGate.*:NoiseAwareBaseline.*:ParseCsv.*:JUnit.*:Markdown.*:Reports.*:Csv.*:ScenarioLoader.*:Partition*:FlightRecorder.*:ReferenceModel*:ReferenceGradient*:MemorySizing.*'

# The other end of the supported range: PyTorch 2.11 (requirements-oldest.txt) in its own
# environment and build directory, then the unit tests, the default suite and PyTorch's pipelining
# judged on it. CI's second leg, after `make test` on the newest, is `make test-oldest SANITIZE=1`:
# the same, sanitized (build-oldest-sanitize), so that one build of each PyTorch serves CI.
OLDEST_DIR ?= build-oldest$(if $(filter 1,$(SANITIZE)),-sanitize)
test-oldest:
	$(MAKE) build BUILD_DIR=$(OLDEST_DIR) TORCH=venv REQUIREMENTS=requirements-oldest.txt SANITIZE=$(SANITIZE)
	cd $(OLDEST_DIR) && $(SANITIZED) $(CURDIR)/scripts/gtest-shards.sh $(JOBS) tests/pipecheck_tests --gtest_filter=$(UNIT_TESTS)':Memory*'
	$(SANITIZED) $(OLDEST_DIR)/pipecheck run --scenarios scenarios/core.csv --out $(OLDEST_DIR)/core --timed-steps 3
	cd $(OLDEST_DIR) && $(SANITIZED) ctest --output-on-failure -R '^(trainers_torch_range|crosscheck_dump_python)$$'

# Mutation testing (not in `make test`: one rebuild and one default-suite run per mutant): the
# one-line bugs of tests/mutants/pipeline.txt planted in pipeline/ one at a time, each file put back
# after its run. MUTANTS=id,id runs some of them; MUTANT_LIST=FILE another list
# (tests/mutants/pipeline-second.txt: written from the code alone, not beside the rows that kill it).
MUTANTS ?=
MUTANT_LIST ?=
mutants: build
	scripts/mutants.py --build $(BUILD_DIR) $(if $(MUTANT_LIST),--list $(MUTANT_LIST)) $(if $(MUTANTS),--only $(MUTANTS))

# AddressSanitizer + UndefinedBehaviorSanitizer over pipecheck's own code (LibTorch stays
# uninstrumented), in its own build directory: the unit tests, then the core suite, whose ranks
# are the same instrumented binary. Any report fails it. -O1 with line tables: fast to build,
# readable stacks. CI runs it after `make test`.
SANITIZE_DIR ?= build-sanitize
sanitize: deps
	@python="$$(scripts/torch-python.sh $(TORCH))" || exit 2; \
	[ -f $(SANITIZE_DIR)/CMakeCache.txt ] || cmake -S . -B $(SANITIZE_DIR) -DCMAKE_BUILD_TYPE=Release \
	  $(SANITIZE_CMAKE) "-DPIPECHECK_PYTHON=$$python" $(if $(PREFIX_PATH),"-DCMAKE_PREFIX_PATH=$(PREFIX_PATH)")
	cmake --build $(SANITIZE_DIR) -j$(JOBS) --target pipecheck pipecheck_tests
	cd $(SANITIZE_DIR) && $(SANITIZE_ENV) $(CURDIR)/scripts/gtest-shards.sh $(JOBS) tests/pipecheck_tests --gtest_filter=$(UNIT_TESTS)
	$(SANITIZE_ENV) $(SANITIZE_DIR)/pipecheck run --scenarios scenarios/core.csv --out $(SANITIZE_DIR)/core --timed-steps 3

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

# pipecheck's trainer against PyTorch's pipelining (trainer=torch) and TorchTitan (trainer=torchtitan)
# on benchmarks/peer.csv's twin rows: every run judged against the reference, the twins alternated
# over rounds; prints tokens/s and peak memory of each, side by side (benchmarks/race.py).
PEER_ROUNDS ?= 3
bench-peer: build
	$(BUILD_PYTHON) benchmarks/race.py --pipecheck $(PIPECHECK) --scenarios benchmarks/peer.csv \
	  --rounds $(PEER_ROUNDS) --threads 1

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR)
