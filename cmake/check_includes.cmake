# The include check: fails when a file under SRC_DIR/<module>/ includes "<other>/..." for a module
# <other> outside ARBOR_CLOSURE_<module> (cmake/modules.cmake). src/cli may include anything.
#
#   cmake -DSRC_DIR=<dir> [-DMODULES_FILE=<modules.cmake>] -P cmake/check_includes.cmake
#
# Prints every violation as "file:line: module 'a' must not include \"b/x.h\" (a may use: ...)"
# and exits non-zero when there is one. Tested by tests/build/include_check_test.sh, which plants
# a forbidden include in a copy of the tree.
cmake_minimum_required(VERSION 3.25)
if(NOT SRC_DIR)
  message(FATAL_ERROR "check_includes: set -DSRC_DIR=<the src directory>")
endif()
if(NOT MODULES_FILE)
  get_filename_component(MODULES_FILE "${CMAKE_CURRENT_LIST_DIR}/modules.cmake" ABSOLUTE)
endif()
include("${MODULES_FILE}")
get_filename_component(SRC_DIR "${SRC_DIR}" ABSOLUTE)

set(violations 0)
set(checked 0)
foreach(m IN LISTS ARBOR_MODULES)
  file(GLOB_RECURSE files "${SRC_DIR}/${m}/*.h" "${SRC_DIR}/${m}/*.cc" "${SRC_DIR}/${m}/*.cu"
       "${SRC_DIR}/${m}/*.cuh")
  foreach(f IN LISTS files)
    math(EXPR checked "${checked} + 1")
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"/]+/")
    file(READ "${f}" content)
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"/]+)/.*$" "\\1" target "${line}")
      if(NOT target IN_LIST ARBOR_MODULES AND NOT target STREQUAL "cli")
        continue()
      endif()
      if(target IN_LIST ARBOR_CLOSURE_${m})
        continue()
      endif()
      string(FIND "${content}" "${line}" offset)
      string(SUBSTRING "${content}" 0 ${offset} before)
      string(REGEX MATCHALL "\n" newlines "${before}")
      list(LENGTH newlines lineno)
      math(EXPR lineno "${lineno} + 1")
      file(RELATIVE_PATH rel "${SRC_DIR}/.." "${f}")
      string(REPLACE ";" " " allowed "${ARBOR_CLOSURE_${m}}")
      string(STRIP "${line}" shown)
      message("${rel}:${lineno}: module '${m}' must not include ${shown} (${m} may use: ${allowed})")
      math(EXPR violations "${violations} + 1")
    endforeach()
  endforeach()
endforeach()
if(violations GREATER 0)
  message(FATAL_ERROR "include check: ${violations} forbidden include(s) in ${checked} files")
endif()
message("include check: ${checked} files, module layering respected")
