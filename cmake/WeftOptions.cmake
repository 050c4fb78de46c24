# Build options that apply to every target: ccache, sanitizers, warnings, OpenMP.

find_program(WEFT_CCACHE ccache)
if(WEFT_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER ${WEFT_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${WEFT_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${WEFT_CCACHE})
endif()

set(WEFT_SANITIZE "" CACHE STRING "Sanitizer: address|undefined|thread or empty")
set_property(CACHE WEFT_SANITIZE PROPERTY STRINGS "" address undefined thread)
if(WEFT_SANITIZE)
  if(NOT WEFT_SANITIZE MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "WEFT_SANITIZE=${WEFT_SANITIZE}: expected address, undefined or thread")
  endif()
  # Host code only: nvcc does not take -fsanitize (device code is checked by compute-sanitizer).
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${WEFT_SANITIZE};-fno-omit-frame-pointer;-g>")
  add_link_options(-fsanitize=${WEFT_SANITIZE})
endif()

add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Wall;-Wextra;-Wno-unused-parameter;-Wno-missing-field-initializers>")
if(CMAKE_BUILD_TYPE STREQUAL "Release")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-O3;-march=native>")
endif()

find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)

# weft_module(<target> SOURCES ... DEPS ...): one library per module folder. A module
# that has no sources yet is an INTERFACE target with the same dependency edges, so
# the dependency direction is fixed before the code arrives.
function(weft_module target)
  cmake_parse_arguments(M "" "" "SOURCES;DEPS" ${ARGN})
  if(M_SOURCES)
    add_library(${target} ${M_SOURCES})
    target_link_libraries(${target} PUBLIC ${M_DEPS})
  else()
    add_library(${target} INTERFACE)
    target_link_libraries(${target} INTERFACE ${M_DEPS})
  endif()
endfunction()
