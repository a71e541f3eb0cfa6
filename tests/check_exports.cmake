# Driven by ctest (cmake -P): the dynamic symbols libflashattn.so defines must all belong to the
# public API of include/flashattn/flashattn.h (namespace flashattn, marked FLASHATTN_API).
# Anything else exported (the static CUDA runtime, libstdc++ or CuTe template instances, the
# library's internals) could interpose on another copy in the same process: see
# docs/DECISIONS.md D-46.
#   -DLIB=<path to libflashattn.so> -DNM=<nm>
foreach(var LIB NM)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_exports.cmake: -D${var}=... is required")
  endif()
endforeach()

execute_process(COMMAND "${NM}" -D --defined-only --demangle "${LIB}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only --demangle ${LIB} failed (${rc}): ${err}")
endif()

# The public names: functions and the two classes (their members, Error's typeinfo/vtable).
set(api_functions "dtype_name|device_name|dtype_size|describe|forward|forward_varlen|plan_kvcache|forward_kvcache|cuda_available|build_info|kernel_name|kernel_override_from_env|check_device_status")
set(api_regex "^(flashattn::(${api_functions})(\\[abi:cxx11\\])?\\(|flashattn::(Tensor|Error)::|(typeinfo|typeinfo name|vtable) for flashattn::Error$)")

string(REPLACE "\n" ";" lines "${out}")
set(api_count 0)
set(foreign "")
foreach(line IN LISTS lines)
  # "<address> <type> <name>"; an undefined-address line (version nodes) has no address
  if(NOT line MATCHES "^[0-9a-fA-F]* *[A-Za-z] (.+)$")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  if(name MATCHES "${api_regex}")
    math(EXPR api_count "${api_count} + 1")
  else()
    string(APPEND foreign "  ${name}\n")
  endif()
endforeach()

if(NOT foreign STREQUAL "")
  message(FATAL_ERROR "${LIB} exports symbols outside flashattn's public API:\n${foreign}")
endif()
if(api_count LESS 10)
  message(FATAL_ERROR "${LIB} exports only ${api_count} API symbols (forward, Tensor, Error, ... expected):\n${out}")
endif()
message(STATUS "${LIB}: ${api_count} exported symbols, all public API")
