# Boundary dtype (issue 22 item 5; driver.h "Boundary dtype", docs/DTYPES.md): toy stages on
# 2 and 4 ranks whose received activations and gradients must equal, element for element, the
# producer's f32 values rounded to bf16 / f16 by a reference conversion (unchanged without the
# option), with the driver's boundary bytes halved; XMESH_HOST_ID=rank/1 puts every rank on its
# own host so the cross-host bytes are nonzero and are checked to halve too.
add_executable(test_pipeline_driver_bdtype ${CMAKE_CURRENT_LIST_DIR}/test_driver_bdtype.c)
target_link_libraries(test_pipeline_driver_bdtype PRIVATE xmesh_pipeline)
set(XMP_BD_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;XMESH_HOST_ID=rank/1")
foreach(np 2 4)
  add_test(NAME pipeline.driver.bdtype.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_pipeline_driver_bdtype> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.driver.bdtype.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
    ENVIRONMENT "${XMP_BD_ENV}")
endforeach()
