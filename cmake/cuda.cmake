# CUDA backend: kernels compiled per (dtype, head dim) instance file, for FLASHATTN_CUDA_ARCHS.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

if(NOT FLASHATTN_CUTLASS_INCLUDE)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_cutlass_inc}/cute/tensor.hpp")
    message(FATAL_ERROR "CUTLASS headers not found: pip install -r requirements.txt, or set FLASHATTN_CUTLASS_INCLUDE")
  endif()
  set(FLASHATTN_CUTLASS_INCLUDE "${_cutlass_inc}" CACHE PATH "CUTLASS/CuTe include dir" FORCE)
endif()
message(STATUS "flashattn: CUTLASS headers in ${FLASHATTN_CUTLASS_INCLUDE}")
message(STATUS "flashattn: CUDA archs ${FLASHATTN_CUDA_ARCHS}, head dims ${FLASHATTN_HEAD_DIMS}, dtypes ${FLASHATTN_DTYPES}")

# The instance files that match the selected dtypes and head dims.
set(_instances "")
foreach(dt ${FLASHATTN_DTYPES})
  foreach(hd ${FLASHATTN_HEAD_DIMS})
    set(_f "${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/instances/fwd_${dt}_hdim${hd}.cu")
    if(NOT EXISTS "${_f}")
      message(FATAL_ERROR "no kernel instance ${_f} (FLASHATTN_DTYPES / FLASHATTN_HEAD_DIMS)")
    endif()
    list(APPEND _instances "${_f}")
    # FP8 storage over the same instance (e4m3 K/V, and for bf16 e4m3 Q): run_fwd_fp8.
    list(APPEND _instances "${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/instances/fwd_${dt}_hdim${hd}_e4m3.cu")
    string(TOUPPER "${dt}" _DT)
    target_compile_definitions(flashattn PRIVATE FLASHATTN_HAS_${_DT}_HDIM${hd}=1)
  endforeach()
endforeach()

file(GLOB _cuda_common CONFIGURE_DEPENDS src/cuda/*.cu src/cuda/*.cpp)
list(FILTER _cuda_common EXCLUDE REGEX "backend_stub\\.cpp$")
target_sources(flashattn PRIVATE ${_cuda_common} ${_instances})
set_target_properties(flashattn PROPERTIES CUDA_ARCHITECTURES "${FLASHATTN_CUDA_ARCHS}" CUDA_RUNTIME_LIBRARY Static)
target_include_directories(flashattn SYSTEM PRIVATE ${FLASHATTN_CUTLASS_INCLUDE})
target_compile_definitions(flashattn PRIVATE FLASHATTN_WITH_CUDA=1)
if("90a" IN_LIST FLASHATTN_CUDA_ARCHS)
  # The sm_90a wgmma kernel (src/cuda/wgmma_kernel.h) is compiled in and chosen on sm_90 devices.
  target_compile_definitions(flashattn PRIVATE FLASHATTN_HAS_SM90A=1)
endif()
target_compile_options(flashattn PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --use_fast_math -O3 -Xptxas=-warn-spills>)
# -lineinfo (source lines for Nsight Compute / compute-sanitizer) records the absolute paths of
# the sources in the device code; wheels leave it out (python/CMakeLists.txt), so that they hold
# no path of the build machine.
if(FLASHATTN_LINEINFO)
  target_compile_options(flashattn PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
endif()
target_link_libraries(flashattn PRIVATE CUDA::cudart_static)
