# SBP tensors, boxing and SBP layers (pipeline/nn/sbp*, boxing.c) under MPI.
set(XMP_SBP_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
foreach(t test_boxing test_sbp_ops)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${t}.c)
    add_executable(${t} ${t}.c)
    target_link_libraries(${t} PRIVATE xmesh_pipeline)
    foreach(np 2 3 4 6)
      add_test(NAME pipeline.sbp.${t}.n${np}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${t}> ${MPIEXEC_POSTFLAGS})
      set_tests_properties(pipeline.sbp.${t}.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
        ENVIRONMENT "${XMP_SBP_ENV}")
    endforeach()
  endif()
endforeach()
