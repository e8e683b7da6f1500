# arbor — top-level entry points. See README.md.
#   make serve   install what is missing, build, start arbor on the default model
#   make test    install what is missing, build, run every test once (release, e2e: Release;
#                unit: ASan/UBSan)
#   make test-asan-all  every unit and release test under ASan/UBSan (before a landing)
#   make test-gpu  build, run the tests that need a CUDA device (skipped without one)
#   make test-slow build, run the exhaustive sweeps make test leaves out (label slow)
#   make test-shards build, run the e2e suites through 1 and 2 (TP) shard processes
#   make bench   benchmarks (slow; not part of make test)
#   make fuzz    long mutation run over the GGUF reader

# The shared models, tokenizers and goldens: SHARED_DIR=..., else $ARBOR_SHARED_DIR, else ../shared.
# Tests read it at run time (ARBOR_SHARED_DIR), and fail, naming the files, when data is missing.
SHARED_DIR ?= $(or $(ARBOR_SHARED_DIR),$(CURDIR)/../shared)
SHARED_ABS := $(abspath $(SHARED_DIR))
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= 2
CMAKE_FLAGS = -G Ninja -DARBOR_SHARED_DIR=$(SHARED_ABS) -DARBOR_UNITY=ON

.PHONY: all deps deps-serve build build-serve build-asan serve test test-release test-asan \
        test-gpu test-slow test-shards test-asan-all bench fuzz clean ctest-costs

all: build

# What building and serving need; `make serve` installs nothing else.
deps-serve:
	@scripts/install_deps.sh

# ... plus what the tests and benchmarks need (GoogleTest, Google Benchmark, node and the
# `openai` npm client, ...).
deps:
	@scripts/timed.sh "dependencies" sh -c \
	  'scripts/install_deps.sh --tests && scripts/install_js_deps.sh && scripts/install_reference.sh'

# `make serve` configures a new build folder without the tests (ARBOR_BUILD_TESTS=OFF, so no
# GoogleTest is needed) and builds only `arbor`; the other targets turn the tests on (a build
# folder that `make serve` made is reconfigured once).
build-serve: deps-serve
	@test -f $(BUILD)/build.ninja || \
	  cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Release -DARBOR_BUILD_TESTS=OFF
	cmake --build $(BUILD) -j $(JOBS) --target arbor

# The sanitizer build: RelWithDebInfo's flags with -O1 (the level the sanitizers' guidance
# recommends) for -O2 and -g1 (line tables: reports keep every frame, inlined ones included, with
# file and line) for -g (build times: docs/build.md). The tests' own sources at -O0, still
# instrumented: under ASan, -O1 doubles their compile time, and they only drive the code under
# test; the directories whose tests compute references keep -O1 (ARBOR_TEST_OPTIMIZE_NUMERIC,
# cmake/ArborTest.cmake). No CUDA.
ASAN_FLAGS = -O1 -g1 -DNDEBUG
$(ASAN_BUILD)/build.ninja:
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DARBOR_SANITIZE=ON \
	  -DARBOR_CUDA=OFF -DCMAKE_C_FLAGS_RELWITHDEBINFO="$(ASAN_FLAGS)" \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(ASAN_FLAGS)" -DARBOR_TEST_OPTIMIZE=-O0

# `make test` builds each test executable once (cmake/ArborTest.cmake, "Passes"): the Release
# build makes `arbor` and the tests of the Release pass (release, e2e, gpu); the sanitizer build
# the unit tests. `cmake --build build` still builds everything.
build: deps
	@grep -qs '^ARBOR_BUILD_TESTS:BOOL=ON' $(BUILD)/CMakeCache.txt || \
	  cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Release -DARBOR_BUILD_TESTS=ON
	@scripts/timed.sh "release build" cmake --build $(BUILD) -j $(JOBS) --target arbor arbor_release_tests

# The sanitizer build compiles only what the unit tests need.
build-asan: deps $(ASAN_BUILD)/build.ninja
	@scripts/timed.sh "sanitizer build" cmake --build $(ASAN_BUILD) -j $(JOBS) --target arbor_unit_tests

serve: build-serve
	@ARBOR_SHARED_DIR=$(SHARED_ABS) scripts/serve.sh $(BUILD)/arbor

test: test-release test-asan

# ctest -j starts the costliest tests first only when it has timings from an earlier run: a
# fresh clone (CI) gets the ones in tests/ctest_costs/ (tests of >= 2 s, seconds on the 2-core
# machine), so that a 2-minute test does not start last and leave a core idle. `make ctest-costs`
# refreshes them from the last runs.
COSTS = Testing/Temporary/CTestCostData.txt
seed-costs = @test -f $(1)/$(COSTS) || install -D -m 644 tests/ctest_costs/$(2).txt $(1)/$(COSTS)

# The Release pass: release, e2e and gpu tests (the unit tests run in the sanitizer pass). gpu
# tests run too: without a CUDA device each is reported as Skipped with its reason.
test-release: build
	$(call seed-costs,$(BUILD),release)
	@cd $(BUILD) && ARBOR_SHARED_DIR=$(SHARED_ABS) $(CURDIR)/scripts/timed.sh "release tests" ctest -L '^(release|e2e|gpu)$$' -LE slow --output-on-failure -j $(JOBS)

test-gpu: build
	cd $(BUILD) && ARBOR_SHARED_DIR=$(SHARED_ABS) ctest -L gpu --output-on-failure -j 1

# The exhaustive sweeps kept out of make test (label slow; their covering subsets run there).
test-slow: build
	cd $(BUILD) && ARBOR_SHARED_DIR=$(SHARED_ABS) ctest -L slow --output-on-failure -j $(JOBS)

# The e2e suite again through shards (label shards): the engine e2e tests and the server's e2e
# suites with the model in one launched `arbor shard` process and in a tensor-parallel group of
# two (docs/shards.md).
test-shards: build
	cmake --build $(BUILD) -j $(JOBS) --target engine_test
	cd $(BUILD) && ARBOR_SHARED_DIR=$(SHARED_ABS) ctest -L shards --output-on-failure -j $(JOBS)

# The sanitizer pass of `make test`: the unit tests (cmake/ArborTest.cmake, "Passes": the
# parsers of what clients and files send, the KV cache's and the scheduler's bookkeeping).
test-asan: build-asan
	$(call seed-costs,$(ASAN_BUILD),sanitizer)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ARBOR_SHARED_DIR=$(SHARED_ABS) $(CURDIR)/scripts/timed.sh "sanitizer tests" \
	  ctest -L '^unit$$' -LE slow --output-on-failure -j $(JOBS)

# Every unit and release test under the sanitizers (the whole tree's memory check; ~30 minutes
# on two cores, outside `make test`), less ASAN_SKIP: numerical sweeps whose code paths the
# smaller tests take under the sanitizers too and which run 4-8x slower there.
# `make test-asan-all ASAN_SKIP=` runs everything.
ASAN_SKIP ?= ^(AffineTypesTest|InflateTest|TreeExactTest|TreeStatisticalTest|BatchInvariance)\.|^AttentionTest\.TreeRowsEqualTheirPaths
test-asan-all: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target arbor_unit_tests arbor_sanitizer_all_tests
	$(call seed-costs,$(ASAN_BUILD),sanitizer)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ARBOR_SHARED_DIR=$(SHARED_ABS) $(CURDIR)/scripts/timed.sh "sanitizer tests, all" \
	  ctest -L '^(unit|release)$$' -LE slow $(if $(ASAN_SKIP),-E '$(ASAN_SKIP)') \
	  --output-on-failure -j $(JOBS)

# The Google Benchmark executables are outside `all` (make test never runs them): built here.
bench: build
	cmake --build $(BUILD) -j $(JOBS) --target arbor_bench
	@ARBOR_SHARED_DIR=$(SHARED_ABS) scripts/bench.sh $(BUILD)

ctest-costs:
	scripts/ctest_costs.sh $(BUILD) > tests/ctest_costs/release.txt
	scripts/ctest_costs.sh $(ASAN_BUILD) > tests/ctest_costs/sanitizer.txt

fuzz: build-asan
	ARBOR_FUZZ_ITERATIONS=200000 $(ASAN_BUILD)/tests/gguf/gguf_fuzz_test

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
