# The include check: makes cmake/modules.cmake's table (and so docs/architecture.md's module map,
# generated from it) true of the code. It fails when
#  * a file under SRC_DIR/<module>/ includes "<other>/..." for a module <other> that ARBOR_DEPS_<module>
#    does not name (a direct declaration: reaching it through another module does not count);
#  * ARBOR_DEPS_<module> names a module that no source of <module> uses: none includes one of its
#    headers or (for modules other than base, whose namespace is arbor itself) names `other::`;
#  * ARBOR_DEPS_<module> names something that is not a module listed before <module> in
#    ARBOR_MODULES (a typo, or a cycle).
# src/cli may include anything.
#
#   cmake -DSRC_DIR=<dir> [-DMODULES_FILE=<modules.cmake>] -P cmake/check_includes.cmake
#
# Prints every violation ("file:line: module 'a' must not include \"b/x.h\" (a declares: ...)",
# "cmake/modules.cmake: module 'a' declares 'b' but ...") and exits non-zero when there is one.
# Tested by tests/build/include_check_test.sh, which plants each kind in a copy of the tree.
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
set(seen "")
foreach(m IN LISTS ARBOR_MODULES)
  foreach(d IN LISTS ARBOR_DEPS_${m})
    if(NOT d IN_LIST seen)
      message("cmake/modules.cmake: module '${m}' declares '${d}', which is not a module listed "
              "before it in ARBOR_MODULES")
      math(EXPR violations "${violations} + 1")
    endif()
  endforeach()
  list(APPEND seen ${m})
endforeach()

foreach(m IN LISTS ARBOR_MODULES)
  file(GLOB_RECURSE files "${SRC_DIR}/${m}/*.h" "${SRC_DIR}/${m}/*.cc" "${SRC_DIR}/${m}/*.cu"
       "${SRC_DIR}/${m}/*.cuh")
  set(used "")
  set(module_text "")
  string(REPLACE ";" " " declared "${ARBOR_DEPS_${m}}")
  foreach(f IN LISTS files)
    math(EXPR checked "${checked} + 1")
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"/]+/")
    file(READ "${f}" content)
    string(APPEND module_text "\n${content}")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"/]+)/.*$" "\\1" target "${line}")
      if(NOT target IN_LIST ARBOR_MODULES AND NOT target STREQUAL "cli")
        continue()
      endif()
      if(target STREQUAL m OR target IN_LIST ARBOR_DEPS_${m})
        list(APPEND used ${target})
        continue()
      endif()
      string(FIND "${content}" "${line}" offset)
      string(SUBSTRING "${content}" 0 ${offset} before)
      string(REGEX MATCHALL "\n" newlines "${before}")
      list(LENGTH newlines lineno)
      math(EXPR lineno "${lineno} + 1")
      file(RELATIVE_PATH rel "${SRC_DIR}/.." "${f}")
      string(STRIP "${line}" shown)
      message("${rel}:${lineno}: module '${m}' must not include ${shown} (${m} declares: "
              "${declared}; add '${target}' to ARBOR_DEPS_${m} in cmake/modules.cmake only if the "
              "layering allows it)")
      math(EXPR violations "${violations} + 1")
    endforeach()
  endforeach()
  foreach(d IN LISTS ARBOR_DEPS_${m})
    if(d IN_LIST used)
      continue()
    endif()
    if(NOT d STREQUAL "base" AND module_text MATCHES "[^A-Za-z0-9_]${d}::")
      continue()
    endif()
    message("cmake/modules.cmake: module '${m}' declares '${d}' but no source of src/${m} "
            "includes a ${d}/ header or names ${d}:: (remove it from ARBOR_DEPS_${m})")
    math(EXPR violations "${violations} + 1")
  endforeach()
endforeach()
if(violations GREATER 0)
  message(FATAL_ERROR "include check: ${violations} violation(s) of cmake/modules.cmake in "
          "${checked} files")
endif()
message("include check: ${checked} files, every include of another module declared and every "
        "declaration used")
