# flashattn_link_shared_libstdcxx(target): link target against the shared libstdc++ by full
# path, before the driver's implicit libraries (GCC on Linux only; elsewhere nothing).
#
# Why: a toolchain that links libstdc++ statically (the GPU machine's CXX=/opt/gcc/bin/g++
# wrapper finds only libstdc++.a) gives each shared object its own private C++ runtime. Then
# flashattn::Error thrown in libflashattn.so and caught in the Python extension crosses two
# runtimes (seen: segfault on a ValueError), and in one process with torch two libstdc++ copies
# meet (docs/DECISIONS.md D-46). With the shared one, the library, the
# extension and torch use the one libstdc++.so.6.
function(flashattn_link_shared_libstdcxx target)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR APPLE OR WIN32)
    return()
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
    OUTPUT_VARIABLE _stdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_stdcxx}" OR NOT EXISTS "${_stdcxx}")
    # The compiler knows no shared one (prints the bare name): take the system's.
    find_file(FLASHATTN_LIBSTDCXX_SO NAMES libstdc++.so.6
      PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib NO_DEFAULT_PATH)
    set(_stdcxx "${FLASHATTN_LIBSTDCXX_SO}")
  endif()
  if(_stdcxx)
    message(STATUS "flashattn: ${target} links the C++ runtime ${_stdcxx}")
    target_link_libraries(${target} PRIVATE "${_stdcxx}")
  else()
    message(WARNING "flashattn: no shared libstdc++ found for ${target}; C++ errors may crash if the "
                    "toolchain links libstdc++ statically")
  endif()
endfunction()
