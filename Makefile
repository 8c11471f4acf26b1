# fsdpx: the two commands a user needs are `make demo` and `make test`; both install what is
# missing first (Debian packages, torch in a cached virtual environment) and are quick when
# everything is already there.

SHELL      := /bin/bash
BUILD      ?= build
JOBS       ?= 2
# ctest runs one test more than JOBS at a time: the multi-rank tests wait on each other's ranks, on
# Slurm and on process start-up, and a third test fills those gaps (2 cores: 1,559 s against
# 1,705 s at 2).
TEST_JOBS  ?= $(shell echo $$(( $(JOBS) + 1 )))
PYTHON     := $(shell bash scripts/setup.sh --print-python)
CMAKE_ARGS ?=
# The instrumented build (clang, AddressSanitizer + UndefinedBehaviorSanitizer, libFuzzer
# coverage) of make test-sanitize and make fuzz. make test-sanitize runs its tests but those
# SANITIZE_SKIP_LIST names (tests/sanitize/skip.txt: the tests whose time is not fsdpx's code, and
# the long multi-rank runs whose C++ paths a kept test runs instrumented too; empty for none);
# SANITIZE_TESTS picks a subset (a ctest regex) and SANITIZE_SKIP leaves more out (a regex).
SAN_BUILD      ?= build-sanitize
SANITIZE_TESTS ?=
SANITIZE_SKIP  ?=
SANITIZE_SKIP_LIST ?= tests/sanitize/skip.txt
FUZZ_SECONDS   ?= 25
# make gpu-check: its own build directory and scripts/gpu-check.sh's options (--help lists them).
GPU_BUILD      ?= build-gpu
GPU_CHECK_ARGS ?=

.PHONY: help setup configure build demo test bench clean sanitize-build test-sanitize fuzz gpu-check

help:  ## list the targets
	@echo "fsdpx make targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/\1|\2/' | \
	  awk -F'|' '{ gsub(/\$$\(BUILD\)/, "$(BUILD)", $$2); gsub(/\$$\(SAN_BUILD\)/, "$(SAN_BUILD)", $$2); \
	    gsub(/\$$\(FUZZ_SECONDS\)/, "$(FUZZ_SECONDS)", $$2); gsub(/\$$\(GPU_BUILD\)/, "$(GPU_BUILD)", $$2); \
	    printf "  make %-14s %s\n", $$1, $$2 }'
	@echo
	@echo "variables: BUILD=$(BUILD) (build directory), JOBS=$(JOBS) (parallel compile jobs), TEST_JOBS=$(TEST_JOBS)"
	@echo "           (tests at once in make test), SAN_BUILD=$(SAN_BUILD),"
	@echo "           SANITIZE_TESTS (ctest regex for make test-sanitize), SANITIZE_SKIP (regex left out besides"
	@echo "           SANITIZE_SKIP_LIST=$(SANITIZE_SKIP_LIST), the tests it leaves out; empty for none),"
	@echo "           FUZZ_SECONDS=$(FUZZ_SECONDS),"
	@echo "           GPU_BUILD=$(GPU_BUILD), GPU_CHECK_ARGS (scripts/gpu-check.sh's options, e.g. --peak-tflops 989)"
	@echo "torch venv: $(dir $(PYTHON)).. (FSDPX_VENV or FSDPX_CACHE_DIR to move it)"

setup:  ## install missing Debian packages (clang 14 only for make test-sanitize and make fuzz), and torch==2.11.0 with matplotlib, safetensors, scikit-learn into the cached venv
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DFSDPX_PYTHON=$(PYTHON) $(CMAKE_ARGS)

configure: setup  ## configure the CMake build in $(BUILD)
	cmake -S . -B $(BUILD) -G Ninja -DFSDPX_PYTHON=$(PYTHON) $(CMAKE_ARGS)

build: setup $(BUILD)/build.ninja  ## build libfsdpx, plugins, hosts and tests
	cmake --build $(BUILD) -j $(JOBS)

demo: build  ## set up, build, and train gpt tiny on 2 CPU ranks (runs/demo: metrics, plot, checkpoint)
	@bash scripts/demo.sh $(BUILD)

# THP_MEM_ALLOC_ENABLE=1: PyTorch's CPU allocator asks for huge pages for tensors of 2 MiB or more.
# The tests' gathers at 1b width page-fault a tenth as often (gpt 1b width, 2 layers, 2 ranks, one
# step: 1.74 million faults and 33.6 CPU-s against 0.19 million and 20.1 CPU-s on this VM); the
# bits and the allocated bytes the tests check are the same.
# OMP_WAIT_POLICY=PASSIVE: an OpenMP thread that waits for work sleeps instead of spinning. The tests
# share the cores (TEST_JOBS tests on JOBS cores, their ranks on top), and a spinning thread burns a
# core another test needs: a one-rank gpt small run beside a busy core took 2.3 CPU-s spinning and
# 0.9 passive; the whole ctest 1,548 CPU-s and 833 s against 1,441 CPU-s and 784 s. Only idle
# threads wait differently: the bits the tests check are the same.
TEST_ENV := THP_MEM_ALLOC_ENABLE=1 OMP_WAIT_POLICY=PASSIVE
# A fresh build directory starts from tests/ctest_costs.txt (each test's seconds, from a run of make
# test) so that ctest starts the longest tests first instead of leaving one for the end; ctest keeps
# the file up to date from then on. A test it does not list only runs in another order.
test: build  ## set up, build, and run every test (ctest; TEST_JOBS at once, PyTorch's huge pages on, OpenMP waits passive)
	@mkdir -p $(BUILD)/Testing/Temporary && [[ -f $(BUILD)/Testing/Temporary/CTestCostData.txt ]] || \
	  cp tests/ctest_costs.txt $(BUILD)/Testing/Temporary/CTestCostData.txt
	cd $(BUILD) && env $(TEST_ENV) ctest --output-on-failure -j $(TEST_JOBS) --timeout 900

sanitize-build:
	@bash scripts/setup.sh --sanitize
	@[[ -f $(SAN_BUILD)/build.ninja ]] || cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
	  -DFSDPX_SANITIZE=address,undefined -DFSDPX_FUZZ=ON -DFSDPX_UNITY_BUILD=OFF -DFSDPX_PYTHON=$(PYTHON) $(CMAKE_ARGS)
	cmake --build $(SAN_BUILD) -j $(JOBS)

test-sanitize: sanitize-build  ## the tests under ASan + UBSan (fsdpx's code instrumented, LibTorch as shipped), in $(SAN_BUILD), but those tests/sanitize/skip.txt leaves out; SANITIZE_TESTS=regex for a subset
	env $(TEST_ENV) bash tests/sanitize/run.sh $(SAN_BUILD) $(JOBS) '$(SANITIZE_SKIP_LIST)' '$(SANITIZE_TESTS)' '$(SANITIZE_SKIP)'

fuzz: sanitize-build  ## run every fuzz target (libFuzzer) FUZZ_SECONDS=$(FUZZ_SECONDS) s on its seed corpus (tests/fuzz)
	bash tests/fuzz/run.sh $(SAN_BUILD) $(FUZZ_SECONDS)

bench: build  ## run the benchmarks: Gloo throughput, engine overlap on/off (2 ranks), optimizer step, checkpoint save/load, activation checkpointing, --deterministic's cost, workers forked vs exec'd, the library's step vs fsdpx-train's, bf16 products on the CPU by layout, fsdpx vs PyTorch FSDP2 (quick set, and gpt small in fp32 and bf16_mixed)
	$(BUILD)/bin/fsdpx-comm-bench --nproc-per-node 2
	$(BUILD)/bin/fsdpx-engine-bench --nproc-per-node 2
	$(BUILD)/bin/fsdpx-optim-bench --python $(PYTHON)
	$(BUILD)/bin/fsdpx-ckpt-bench --nproc-per-node 2
	bash benchmarks/activation_checkpointing.sh $(BUILD)
	bash benchmarks/deterministic.sh $(BUILD)
	bash benchmarks/worker_start.sh $(BUILD)
	$(PYTHON) benchmarks/library_vs_train.py --build $(BUILD)
	$(PYTHON) benchmarks/cpu_bf16_mm.py
	$(PYTHON) benchmarks/vs_fsdp2/compare.py --fsdpx-bin $(BUILD) --python $(PYTHON) --quick
	$(PYTHON) benchmarks/vs_fsdp2/compare.py --fsdpx-bin $(BUILD) --python $(PYTHON) --rounds 2 \
	  --configs small:full_shard:fp32:sgd,small:full_shard:fp32:adamw,small:shard_grad_op:fp32:adamw,small:full_shard:bf16_mixed:adamw

# No setup prerequisite: a GPU machine has no network; the script brings the build's dependencies.
gpu-check:  ## on a GPU machine, no network: build in $(GPU_BUILD), run the gpu and device tests, print the GPU table
	bash scripts/gpu-check.sh --build-dir $(GPU_BUILD) $(GPU_CHECK_ARGS)

clean:  ## remove the build directory (the torch venv and ccache stay)
	rm -rf $(BUILD)
