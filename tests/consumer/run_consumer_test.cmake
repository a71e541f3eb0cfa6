# Driven by ctest (cmake -P): install the built project into a fresh prefix, then configure,
# build and run tests/consumer against that prefix only.
#   -DBUILD_DIR= -DCONSUMER_SOURCE= -DWORK_DIR= -DGENERATOR= [-DCONFIG=] [-DCXX_COMPILER=]
foreach(var BUILD_DIR CONSUMER_SOURCE WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" --config ${CONFIG})
if(NOT EXISTS "${prefix}/include/flashattn/flashattn.h")
  message(FATAL_ERROR "install: include/flashattn/flashattn.h missing under ${prefix}")
endif()

set(configure_args -S "${CONSUMER_SOURCE}" -B "${build}" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_BUILD_TYPE=${CONFIG}"
    # only the fresh prefix may satisfy find_package(flashattn)
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
run_step("configure consumer" ${CMAKE_COMMAND} ${configure_args})
run_step("build consumer" ${CMAKE_COMMAND} --build "${build}" --config ${CONFIG})

# The executable: single-config generators put it in the build root.
set(app "${build}/consumer_app")
if(NOT EXISTS "${app}")
  set(app "${build}/${CONFIG}/consumer_app")
endif()
run_step("run consumer" "${app}")
message(STATUS "${step_output}")
