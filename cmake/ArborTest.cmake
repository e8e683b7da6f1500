# arbor_add_test(NAME SOURCES a.cc b.cc LIBS arbor_x LABELS unit [TIMEOUT s] [PREFIX p.]
#                [SLOW gtest-filter])
#
# One GoogleTest executable, each test registered with CTest and labelled:
#   unit     a unit test of the directories in ARBOR_SANITIZER_TEST_DIRS (below): runs under
#            ASan/UBSan (the sanitizer pass of `make test`)
#   release  what `unit` becomes everywhere else: the engine, executor, model, kernels, sampling,
#            speculation, server, shard, convert and load-generator units, and the directories
#            that set ARBOR_TEST_NUMERIC (their tests compute references and run 4-8x slower
#            under the sanitizers); they run in the Release pass. `make test-asan-all` runs them
#            under the sanitizers too.
#   e2e   runs the real binary / server; Release only
#   slow  kept out of `make test`; `make test-slow` runs them. SLOW names, as a GoogleTest
#         filter ("Suite.Name:Suite2.*"), the tests of an executable labelled `slow` instead of
#         LABELS: exhaustive sweeps whose covering subset runs in the regular pass.
#   gpu   needs a CUDA device (`make test-gpu`; `make test` runs them too). Each such test
#         GTEST_SKIP()s with the reason when there is none, and CTest reports it as Skipped
#         (SKIP_REGULAR_EXPRESSION on GoogleTest's "[  SKIPPED ]" line, or on the skip of a
#         whole GPU twin executable, tests/support/test_device.h) instead of Passed.
# Every test gets ARBOR_SOURCE_DIR as a macro. Shared data paths and the arbor executable come
# from arbor_test_support (tests/support: test::shared_path, test::require_shared_file,
# test::run_arbor), which a test links through LIBS; a test that runs the binary adds
# `add_dependencies(<test> arbor)` itself.
# PREFIX is put before every CTest name ("loadgen." makes `ctest -R loadgen` select them).
#
# Passes. `make test` compiles and runs each test executable once: the sanitizer build builds
# arbor_unit_tests (every `unit` executable: the libraries of ARBOR_SANITIZER_TEST_DIRS, a
# third of src) and runs label unit; the Release build builds `arbor` and arbor_release_tests
# (every release, e2e and gpu executable) and runs those labels. `make test-asan-all` builds
# arbor_sanitizer_all_tests (unit and release) under the sanitizers and runs both labels: the
# whole-tree memory check, for before a landing (docs/build.md). A tree built whole
# (`cmake --build build`) can run any label. Tests are discovered when ctest runs
# (DISCOVERY_MODE PRE_TEST), so their labels are always the current configuration's, never those
# baked in when an executable was last linked.
# Every test executable is test code (arbor_test_code below).

# The test code's own compile settings, for every test executable and test library (tests/):
#  * ARBOR_TEST_OPTIMIZE (-O1; empty in a Debug build): the optimisation level of the test
#    sources. The code under test, the arbor_* libraries of src/, is compiled as the build type
#    says (-O3 in Release); the tests' own sources only drive it and compare results. The
#    sanitizer build (Makefile) sets -O0: there -O1 doubles a test source's compile time.
#  * ARBOR_TEST_OPTIMIZE_NUMERIC (-O1): the level of the directories whose tests compute their
#    own references (matmuls, attention, whole forwards, enumerations), whatever
#    ARBOR_TEST_OPTIMIZE says: a directory sets ARBOR_TEST_NUMERIC before adding its tests
#    (tests/kernels, model, sampling, spec, cuda). At -O0 their references would run 3-10x
#    slower. (The drivers' own loops slow down too at -O0: ToolCallParse, GgufFuzz, Export and
#    OutputGrammar ran 3-4x slower in a Release build, which is why Release keeps -O1.)
#  * with ARBOR_PCH, a precompiled header of GoogleTest and the standard headers the tests use
#    most, built by arbor_test_support (tests/support) and reused by every test target;
#    arbor_test_pch_numeric builds it a second time at the numeric level when the two differ
#    (GCC refuses a header built at another -O level: `__OPTIMIZE__` differs). GCC uses it only
#    in a compilation that defines every macro the header was built with, so
#    arbor_test_support keeps its own definitions on the sources that read them, never on the
#    target (GCC warns "not used because 'X' not defined" otherwise). Only what nearly every test
#    includes is in it: a larger header costs each source more to load than it saves the few that
#    parse it (nlohmann/json: 17 of ~115 test sources).
if(CMAKE_BUILD_TYPE STREQUAL "Debug")
  set(arbor_test_optimize_default "")
  set(arbor_test_optimize_numeric_default "")
else()
  set(arbor_test_optimize_default "-O1")
  set(arbor_test_optimize_numeric_default "-O1")
endif()
set(ARBOR_TEST_OPTIMIZE "${arbor_test_optimize_default}" CACHE STRING
    "Optimisation flag of the test sources (tests/); empty: the build type's")
set(ARBOR_TEST_OPTIMIZE_NUMERIC "${arbor_test_optimize_numeric_default}" CACHE STRING
    "Optimisation flag of the test sources that compute references (ARBOR_TEST_NUMERIC)")
set(ARBOR_TEST_PCH_HEADERS
  <gtest/gtest.h> <algorithm> <cstdint> <map> <memory> <optional> <random> <string> <vector>)
if(ARBOR_TEST_OPTIMIZE STREQUAL ARBOR_TEST_OPTIMIZE_NUMERIC)
  set(arbor_test_numeric_pch arbor_test_support)
else()
  set(arbor_test_numeric_pch arbor_test_pch_numeric)
endif()

# arbor_test_code(TARGET): TARGET is test code (the settings above).
function(arbor_test_code target)
  set(level "${ARBOR_TEST_OPTIMIZE}")
  set(pch arbor_test_support)
  if(ARBOR_TEST_NUMERIC)
    set(level "${ARBOR_TEST_OPTIMIZE_NUMERIC}")
    set(pch ${arbor_test_numeric_pch})
  endif()
  if(level)
    target_compile_options(${target} PRIVATE ${level})
  endif()
  if(ARBOR_PCH)
    # A header GCC cannot use is an error, not a warning that silently costs the build its PCH.
    target_compile_options(${target} PRIVATE -Werror=invalid-pch)
    if(target STREQUAL pch)
      target_precompile_headers(${target} PRIVATE ${ARBOR_TEST_PCH_HEADERS})
    else()
      target_precompile_headers(${target} REUSE_FROM ${pch})
    endif()
  endif()
endfunction()

# The directories whose unit tests make the sanitizer pass of `make test` ("Passes" above): the
# code that parses what clients and files send (tokenizers, chat templates and their tool-call
# and reasoning parsers, grammars, GGUF), the KV cache's and the scheduler's bookkeeping, the
# collectives' shared memory. Their libraries are small, so the sanitizer build is too.
set(ARBOR_SANITIZER_TEST_DIRS base chat collective gguf grammar kv sched step tokenizer)

function(arbor_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT;PREFIX;SLOW" "SOURCES;LIBS;LABELS" ${ARGN})
  get_filename_component(dir_name "${CMAKE_CURRENT_SOURCE_DIR}" NAME)
  if(ARBOR_TEST_NUMERIC OR NOT dir_name IN_LIST ARBOR_SANITIZER_TEST_DIRS)
    list(TRANSFORM T_LABELS REPLACE "^unit$" "release")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE ARBOR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  arbor_test_code(${name})
  if("unit" IN_LIST T_LABELS)
    add_dependencies(arbor_unit_tests ${name})
  endif()
  if("release" IN_LIST T_LABELS OR "e2e" IN_LIST T_LABELS OR "gpu" IN_LIST T_LABELS)
    add_dependencies(arbor_release_tests ${name})
  endif()
  if("unit" IN_LIST T_LABELS OR "release" IN_LIST T_LABELS)
    add_dependencies(arbor_sanitizer_all_tests ${name})
  endif()
  # A sanitizer build (ARBOR_SANITIZE) registers only the unit and release tests (what
  # `make test-asan` and `make test-asan-all` run): the e2e and gpu executables stay out of `all`
  # and out of ctest there, so a binary left from an earlier configuration never runs stale.
  if(ARBOR_SANITIZE AND NOT "unit" IN_LIST T_LABELS AND NOT "release" IN_LIST T_LABELS)
    set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL ON)
    return()
  endif()
  set(prefix_args)
  if(T_PREFIX)
    set(prefix_args TEST_PREFIX "${T_PREFIX}")
  endif()
  set(skip_args)
  if("gpu" IN_LIST T_LABELS)
    set(skip_args SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]|test_device.h:[0-9]+: Skipped")
  endif()
  if(NOT T_SLOW)
    gtest_discover_tests(${name} ${prefix_args}
      PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} ${skip_args}
      DISCOVERY_TIMEOUT 120 DISCOVERY_MODE PRE_TEST)
    return()
  endif()
  gtest_discover_tests(${name} ${prefix_args} TEST_FILTER "-${T_SLOW}"
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} ${skip_args}
    DISCOVERY_TIMEOUT 120 DISCOVERY_MODE PRE_TEST)
  # Label `slow` alone: CMake 3.25's gtest_discover_tests cannot pass a list-valued property.
  gtest_discover_tests(${name} ${prefix_args} TEST_FILTER "${T_SLOW}"
    PROPERTIES LABELS slow TIMEOUT ${T_TIMEOUT} ${skip_args}
    DISCOVERY_TIMEOUT 120 DISCOVERY_MODE PRE_TEST)
endfunction()

# arbor_add_shard_pass(<test executable> [FILTER gtest-filter]): registers the executable's tests
# (or those FILTER names) twice more, as shards1.<test> and shards2.<test>, labelled `shards`,
# with ARBOR_TEST_SHARDS=1 / 2 in their environment: the executor they load
# (tests/engine/executor_under_test.h) is then one launched `arbor shard` process, or a
# tensor-parallel group of two, instead of the in-process one. `make test-shards` runs them.
function(arbor_add_shard_pass name)
  if(ARBOR_SANITIZE)
    return()  # the shard passes run against the Release build
  endif()
  cmake_parse_arguments(S "" "FILTER;TIMEOUT" "" ${ARGN})
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT 1200)
  endif()
  set(filter_args)
  if(S_FILTER)
    set(filter_args TEST_FILTER "${S_FILTER}")
  endif()
  foreach(n 1 2)
    gtest_discover_tests(${name} TEST_PREFIX "shards${n}." ${filter_args}
      PROPERTIES LABELS shards TIMEOUT ${S_TIMEOUT} ENVIRONMENT "ARBOR_TEST_SHARDS=${n}"
      DISCOVERY_TIMEOUT 120 DISCOVERY_MODE PRE_TEST)
  endforeach()
endfunction()
