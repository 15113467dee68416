# Boxing with shared splits (several mesh axes split one tensor dim): every element and the
# analytic minimum of bytes per single-axis change (pipeline/nn/boxing.c; docs/BOXING_BYTES.md).
set(XMP_BOX20_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
add_executable(test_box_shared test_box_shared.c)
target_link_libraries(test_box_shared PRIVATE xmesh_pipeline)
foreach(np 4 6 8)
  add_test(NAME pipeline.box20.test_box_shared.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_box_shared> ${MPIEXEC_POSTFLAGS} --seed 20)
  set_tests_properties(pipeline.box20.test_box_shared.n${np} PROPERTIES LABELS "pipeline;mpi"
    TIMEOUT 60 ENVIRONMENT "${XMP_BOX20_ENV}")
endforeach()
