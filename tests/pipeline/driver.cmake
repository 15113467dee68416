# Pipeline driver under mpiexec: a toy model (y = tanh(x W) per stage) over
# 4 and 6 ranks, every schedule x delay_wgrad x comm mode checked against a
# one-process computation; graph a also writes a Chrome trace.
add_executable(test_pipeline_driver ${CMAKE_CURRENT_LIST_DIR}/test_driver.c)
target_link_libraries(test_pipeline_driver PRIVATE xmesh_pipeline)
set(XMP_DRIVER_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
foreach(spec "4;abd" "6;c")
  list(GET spec 0 np)
  list(GET spec 1 graphs)
  add_test(NAME pipeline.driver.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_pipeline_driver> --graph ${graphs}
            --trace ${CMAKE_CURRENT_BINARY_DIR}/driver_trace_n${np}.json ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.driver.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
    ENVIRONMENT "${XMP_DRIVER_ENV}")
endforeach()
# The same with every edge its own plan (XMESH_PIPE_BUNDLE=0): graph d's three tensors that
# cross one boundary in one slot move as three plans instead of one plan of many.
add_test(NAME pipeline.driver.nobundle.n4
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
          ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_pipeline_driver> --graph d ${MPIEXEC_POSTFLAGS})
set_tests_properties(pipeline.driver.nobundle.n4 PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
  ENVIRONMENT "${XMP_DRIVER_ENV};XMESH_PIPE_BUNDLE=0")
# Virtual stages under mpiexec: several model stages per rank group (interleaved-1f1b, zb-v,
# v-1f1b, with and without the weight-gradient delay, three comm modes), boundaries between
# stages of one group and between groups as xmesh plans, every gradient element against a
# one-process computation; 2 and 4 ranks.
add_executable(test_pipeline_driver_virtual ${CMAKE_CURRENT_LIST_DIR}/test_driver_virtual.c)
target_link_libraries(test_pipeline_driver_virtual PRIVATE xmesh_pipeline)
foreach(np 2 4)
  add_test(NAME pipeline.driver.virtual.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_pipeline_driver_virtual> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.driver.virtual.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
    ENVIRONMENT "${XMP_DRIVER_ENV}")
endforeach()
