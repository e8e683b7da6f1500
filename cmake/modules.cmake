# The module table: every library under src/ and the modules it may use. It is the one place
# this is decided: CMakeLists.txt links each arbor_<module> against exactly these, and the
# include check (cmake/check_includes.cmake, the ctest IncludeCheck.*) fails when a source file of
# a module includes a header of a module its list does not name, when a listed module is not used
# (no source includes its headers or names its namespace), or when a module names one that does
# not come before it in ARBOR_MODULES (dependency order). docs/architecture.md's module map is
# generated from this file (cmake/module_graph.cmake; the ctest ModuleMap.* fails when it is stale).
set(ARBOR_MODULES
  base grammar gguf tokenizer convert kv kernels collective model cuda sampling step spec sched executor
  shard engine router http chat server loadgen)

set(ARBOR_DEPS_base "")
# Structured output: grammars, their byte-level automata and token masks. Pure logic on bytes.
set(ARBOR_DEPS_grammar base)
set(ARBOR_DEPS_gguf base)
set(ARBOR_DEPS_tokenizer base gguf)
set(ARBOR_DEPS_convert base gguf)
set(ARBOR_DEPS_kv base)
set(ARBOR_DEPS_kernels base gguf)
# Collectives of a tensor-parallel group (all-reduce, gather): tagged, with deadlines.
set(ARBOR_DEPS_collective base)
set(ARBOR_DEPS_model base gguf kernels collective)
# The CUDA ops behind model::ForwardOps (a stub without -DARBOR_CUDA=ON).
set(ARBOR_DEPS_cuda base gguf kernels model)
set(ARBOR_DEPS_sampling base grammar)
# The step protocol's values and the executor interface: what crosses the executor boundary.
set(ARBOR_DEPS_step base sampling)
# The proposer interface (every drafter returns a TokenTree) and the model-free proposers (n-gram
# lookup, suffix tries): pure logic on tokens.
set(ARBOR_DEPS_spec base sampling)
# Pure scheduling logic: never tensors or kernels.
set(ARBOR_DEPS_sched base kv sampling step)
# Executors run the model behind the step protocol; the engine never sees them.
set(ARBOR_DEPS_executor base collective grammar tokenizer kernels model cuda sampling step spec)
# Model shards over gRPC: the shard process's server over the local executor, and the engine's
# RemoteExecutor behind the step protocol (docs/shards.md).
set(ARBOR_DEPS_shard base collective grammar sampling step executor)
set(ARBOR_DEPS_engine base kv sampling step sched tokenizer)
# The router over replicas and the replicas' side of its protocol (docs/router.md): engines
# behind engine::Engine, talking gRPC; the sampling messages are the shard protocol's.
set(ARBOR_DEPS_router base kv sampling sched engine shard)
set(ARBOR_DEPS_http base)
set(ARBOR_DEPS_chat base grammar)
set(ARBOR_DEPS_server base grammar tokenizer sampling step sched engine http chat)
set(ARBOR_DEPS_loadgen base http)

# ARBOR_CLOSURE_<module>: the module itself and every module it uses, transitively (the module map
# draws an arrow only where no longer path implies it: cmake/module_graph.cmake).
foreach(m IN LISTS ARBOR_MODULES)
  set(closure ${m})
  foreach(d IN LISTS ARBOR_DEPS_${m})
    list(APPEND closure ${ARBOR_CLOSURE_${d}})
  endforeach()
  list(REMOVE_DUPLICATES closure)
  set(ARBOR_CLOSURE_${m} ${closure})
endforeach()

# arbor_module(<name> SOURCES ... [PRIVATE_LIBS ...] [PUBLIC_LIBS ...]): the library of src/<name>,
# linked PUBLIC against the modules of its table entry.
# arbor_no_unity(SOURCE...): these sources (of the calling directory's targets) compile alone in a
# unity build (ARBOR_UNITY): their file-local helpers share a name with a neighbour's.
function(arbor_no_unity)
  set_source_files_properties(${ARGN} DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()

function(arbor_module name)
  cmake_parse_arguments(M "" "" "SOURCES;PRIVATE_LIBS;PUBLIC_LIBS" ${ARGN})
  add_library(arbor_${name} STATIC ${M_SOURCES})
  foreach(d IN LISTS ARBOR_DEPS_${name})
    target_link_libraries(arbor_${name} PUBLIC arbor_${d})
  endforeach()
  if(M_PUBLIC_LIBS)
    target_link_libraries(arbor_${name} PUBLIC ${M_PUBLIC_LIBS})
  endif()
  if(M_PRIVATE_LIBS)
    target_link_libraries(arbor_${name} PRIVATE ${M_PRIVATE_LIBS})
  endif()
endfunction()

# arbor_grpc_protocol(<proto> <gen_files_var>): the C++ messages and gRPC stubs of
# src/<proto> (e.g. shard/shard.proto), generated at build time by Debian's protoc and
# grpc_cpp_plugin into ${CMAKE_CURRENT_BINARY_DIR}/gen/<dir>/; <gen_files_var> gets the four
# generated paths. `DEPENDS` more .proto files it imports. A module compiles the two .cc files
# through one proto.cc (generated gRPC code is slow to compile) and adds gen/ to its includes.
function(arbor_grpc_protocol proto out_var)
  cmake_parse_arguments(P "" "" "DEPENDS" ${ARGN})
  find_program(ARBOR_PROTOC protoc REQUIRED)
  find_program(ARBOR_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
  set(gen_dir ${CMAKE_CURRENT_BINARY_DIR}/gen)
  string(REGEX REPLACE "\\.proto$" "" stem ${proto})
  set(files ${gen_dir}/${stem}.pb.cc ${gen_dir}/${stem}.pb.h ${gen_dir}/${stem}.grpc.pb.cc
    ${gen_dir}/${stem}.grpc.pb.h)
  set(deps ${PROJECT_SOURCE_DIR}/src/${proto})
  foreach(d IN LISTS P_DEPENDS)
    list(APPEND deps ${PROJECT_SOURCE_DIR}/src/${d})
  endforeach()
  add_custom_command(
    OUTPUT ${files}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${gen_dir}
    COMMAND ${ARBOR_PROTOC} -I ${PROJECT_SOURCE_DIR}/src --cpp_out=${gen_dir} --grpc_out=${gen_dir}
      --plugin=protoc-gen-grpc=${ARBOR_GRPC_CPP_PLUGIN} ${PROJECT_SOURCE_DIR}/src/${proto}
    DEPENDS ${deps}
    COMMENT "protoc: src/${proto}"
    VERBATIM)
  set_source_files_properties(${files} PROPERTIES GENERATED ON)
  # proto.cc includes the generated sources: compiled alone, quietly, and not instrumented in
  # the sanitizer build (it was half of a module's compile time there).
  set_source_files_properties(proto.cc PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON COMPILE_OPTIONS -w)
  if(ARBOR_SANITIZE)
    set_property(SOURCE proto.cc APPEND PROPERTY COMPILE_OPTIONS -fno-sanitize=all)
  endif()
  set(${out_var} ${files} PARENT_SCOPE)
endfunction()
