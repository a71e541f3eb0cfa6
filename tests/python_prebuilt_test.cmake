# Driven by ctest (cmake -P): the documented prebuilt path (issue 28). Installs the built
# library into a fresh prefix (`cmake --install`), builds the Python extension against it
# (cmake -S python -DFLASHATTN_PREBUILT=<prefix>), then imports flashattn in fresh interpreters:
# alone (NumPy calls, a library error caught as ValueError), and when torch is importable,
# before and after torch (tests/python/import_order.py).
# With -DSTATIC_LIBSTDCXX=ON the library is first built afresh (CPU backend) with libstdc++
# linked statically, as the GPU machine's compiler wrapper does: the condition of issue 28's
# "free(): invalid pointer" (docs/DECISIONS.md D-46); skipped when torch is not importable.
#   -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR= -DGENERATOR= -DPYTHON= [-DCONFIG=] [-DCXX_COMPILER=]
#   [-DSTATIC_LIBSTDCXX=ON]
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR PYTHON)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "python_prebuilt_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

set(prefix "${WORK_DIR}/prefix")
set(ext "${WORK_DIR}/ext")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${name}: ok ${out}")
endfunction()

execute_process(COMMAND "${PYTHON}" -c "import torch" RESULT_VARIABLE no_torch OUTPUT_QUIET ERROR_QUIET)
if(STATIC_LIBSTDCXX)
  if(NOT no_torch EQUAL 0)
    message(STATUS "SKIPPED: torch is not importable")
    return()
  endif()
  set(lib_build "${WORK_DIR}/lib-build")
  set(lib_args -S "${SOURCE_DIR}" -B "${lib_build}" -G "${GENERATOR}" "-DCMAKE_BUILD_TYPE=${CONFIG}"
      -DFLASHATTN_CUDA=OFF -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_CLI=OFF
      -DFLASHATTN_SHARED_LIBSTDCXX=OFF "-DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++")
  if(CXX_COMPILER)
    list(APPEND lib_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
  endif()
  run_step("configure the library (static libstdc++)" ${CMAKE_COMMAND} ${lib_args})
  run_step("build the library" ${CMAKE_COMMAND} --build "${lib_build}" --config ${CONFIG})
  set(BUILD_DIR "${lib_build}")
endif()
run_step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" --config ${CONFIG})
set(configure_args -S "${SOURCE_DIR}/python" -B "${ext}" -G "${GENERATOR}"
    "-DFLASHATTN_PREBUILT=${prefix}" "-DPython_EXECUTABLE=${PYTHON}" "-DCMAKE_BUILD_TYPE=${CONFIG}")
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
run_step("configure the extension" ${CMAKE_COMMAND} ${configure_args})
run_step("build the extension" ${CMAKE_COMMAND} --build "${ext}" --config ${CONFIG})

set(check "${SOURCE_DIR}/tests/python/import_order.py")
set(orders "flashattn")
if(no_torch EQUAL 0)
  list(APPEND orders "flashattn,torch" "torch,flashattn")
else()
  message(STATUS "torch is not importable: the import-order checks with torch are skipped")
endif()
foreach(order IN LISTS orders)
  run_step("import ${order}" ${CMAKE_COMMAND} -E env "PYTHONPATH=${ext}/site" "${PYTHON}" "${check}" "${order}")
endforeach()
