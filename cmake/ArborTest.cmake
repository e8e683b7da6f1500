# arbor_add_test(NAME SOURCES a.cc b.cc LIBS arbor_x LABELS unit [TIMEOUT s] [PREFIX p.])
#
# One GoogleTest executable, each test registered with CTest and labelled:
#   unit  fast, runs in Release and under ASan/UBSan
#   e2e   runs the real binary / server; Release only
#   slow  kept out of `make test`
#   gpu   needs a CUDA device (`make test-gpu`; `make test` runs them too). Each such test
#         GTEST_SKIP()s with the reason when there is none, and CTest reports it as Skipped
#         (SKIP_REGULAR_EXPRESSION on GoogleTest's "[  SKIPPED ]" line, or on the skip of a
#         whole GPU twin executable, tests/support/test_device.h) instead of Passed.
# Every test gets ARBOR_SOURCE_DIR as a macro. Shared data paths and the arbor executable come
# from arbor_test_support (tests/support: test::shared_path, test::require_shared_file,
# test::run_arbor), which a test links through LIBS; a test that runs the binary adds
# `add_dependencies(<test> arbor)` itself.
# PREFIX is put before every CTest name ("loadgen." makes `ctest -R loadgen` select them).
function(arbor_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT;PREFIX" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE ARBOR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if("unit" IN_LIST T_LABELS)
    add_dependencies(arbor_unit_tests ${name})
  endif()
  set(prefix_args)
  if(T_PREFIX)
    set(prefix_args TEST_PREFIX "${T_PREFIX}")
  endif()
  set(skip_args)
  if("gpu" IN_LIST T_LABELS)
    set(skip_args SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]|test_device.h:[0-9]+: Skipped")
  endif()
  gtest_discover_tests(${name} ${prefix_args}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} ${skip_args}
    DISCOVERY_TIMEOUT 120)
endfunction()
