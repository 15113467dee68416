# Boxing byte counter (pipeline/nn/sbp.c xmp_comm_counts; docs/BOXING_BYTES.md).
set(XMP_BYTES_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
add_executable(test_comm_bytes test_comm_bytes.c)
target_link_libraries(test_comm_bytes PRIVATE xmesh_pipeline)
foreach(np 2 4)
  add_test(NAME pipeline.bytes.test_comm_bytes.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_comm_bytes> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.bytes.test_comm_bytes.n${np} PROPERTIES LABELS "pipeline;mpi"
    TIMEOUT 60 ENVIRONMENT "${XMP_BYTES_ENV}")
endforeach()
