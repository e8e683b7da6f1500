# arbor — top-level entry points. See README.md.
#   make serve   install what is missing, build, start arbor on the default model
#   make test    install what is missing, build, run every test (Release + ASan/UBSan unit tests)
#   make test-gpu  build, run the tests that need a CUDA device (skipped without one)
#   make bench   benchmarks (slow; not part of make test)
#   make fuzz    long mutation run over the GGUF reader

# The shared models, tokenizers and goldens: SHARED_DIR=..., else $ARBOR_SHARED_DIR, else ../shared.
# Tests read it at run time (ARBOR_SHARED_DIR), and fail, naming the files, when data is missing.
SHARED_DIR ?= $(or $(ARBOR_SHARED_DIR),$(CURDIR)/../shared)
SHARED_ABS := $(abspath $(SHARED_DIR))
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= 2
CMAKE_FLAGS = -G Ninja -DARBOR_SHARED_DIR=$(SHARED_ABS)

.PHONY: all deps deps-serve build build-serve build-asan serve test test-release test-asan \
        test-gpu bench fuzz clean

all: build

# What building and serving need; `make serve` installs nothing else.
deps-serve:
	@scripts/install_deps.sh

# ... plus what the tests and benchmarks need (GoogleTest, Google Benchmark, node and the
# `openai` npm client, ...).
deps:
	@scripts/install_deps.sh --tests
	@scripts/install_js_deps.sh
	@scripts/install_reference.sh

# `make serve` configures a new build folder without the tests (ARBOR_BUILD_TESTS=OFF, so no
# GoogleTest is needed) and builds only `arbor`; the other targets turn the tests on (a build
# folder that `make serve` made is reconfigured once).
build-serve: deps-serve
	@test -f $(BUILD)/build.ninja || \
	  cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Release -DARBOR_BUILD_TESTS=OFF
	cmake --build $(BUILD) -j $(JOBS) --target arbor

$(ASAN_BUILD)/build.ninja:
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DARBOR_SANITIZE=ON \
	  -DARBOR_CUDA=OFF

build: deps
	@grep -qs '^ARBOR_BUILD_TESTS:BOOL=ON' $(BUILD)/CMakeCache.txt || \
	  cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Release -DARBOR_BUILD_TESTS=ON
	cmake --build $(BUILD) -j $(JOBS)

# The sanitizer build compiles only what the unit tests need.
build-asan: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target arbor_unit_tests

serve: build-serve
	@ARBOR_SHARED_DIR=$(SHARED_ABS) scripts/serve.sh $(BUILD)/arbor

test: test-release test-asan

# gpu tests run too: without a CUDA device each is reported as Skipped with its reason.
test-release: build
	cd $(BUILD) && ARBOR_SHARED_DIR=$(SHARED_ABS) ctest -L 'unit|e2e|gpu' -LE slow --output-on-failure -j $(JOBS)

test-gpu: build
	cd $(BUILD) && ARBOR_SHARED_DIR=$(SHARED_ABS) ctest -L gpu --output-on-failure -j 1

test-asan: build-asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ARBOR_SHARED_DIR=$(SHARED_ABS) ctest -L unit -LE slow --output-on-failure -j $(JOBS)

bench: build
	@ARBOR_SHARED_DIR=$(SHARED_ABS) scripts/bench.sh $(BUILD)

fuzz: build-asan
	ARBOR_FUZZ_ITERATIONS=200000 $(ASAN_BUILD)/tests/gguf/gguf_fuzz_test

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
