# cmake -P script: see CMakeLists.txt next to it.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/xmesh.h include/xmesh/mpi.h lib/libxmesh.so lib/libxmesh.a lib/pkgconfig/xmesh.pc
          lib/cmake/xmesh/xmeshConfig.cmake bin/xmesh-plan)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
# 1. find_package(xmesh) -> xmesh::xmesh
run(${CMAKE_COMMAND} -S ${SRC_DIR} -B ${WORK_DIR}/cmake-build -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_C_COMPILER=${C_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build)
run(${WORK_DIR}/cmake-build/consumer)
# 2. pkg-config
set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
execute_process(COMMAND pkg-config --cflags --libs xmesh OUTPUT_VARIABLE flags
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not find xmesh")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} ${SRC_DIR}/consumer.c -o ${WORK_DIR}/consumer-pc ${flags}
    -Wl,-rpath,${prefix}/lib)
run(${WORK_DIR}/consumer-pc)
message("install.consumer: find_package and pkg-config consumers built and passed")
