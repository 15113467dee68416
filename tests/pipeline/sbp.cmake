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

# SBP layer norm and attention: every input signature on meshes of 1 (n2, n3), 2 (n4) and
# 3 and 4 axes (n8) against the serial kernels, plus FD checks.
add_executable(test_sbp_layers test_sbp_layers.c)
target_link_libraries(test_sbp_layers PRIVATE xmesh_pipeline)
foreach(np 2 3 4 8)
  foreach(op ln attn)
    add_test(NAME pipeline.sbp.test_sbp_layers.${op}.n${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_sbp_layers> ${MPIEXEC_POSTFLAGS} --op ${op})
    set_tests_properties(pipeline.sbp.test_sbp_layers.${op}.n${np} PROPERTIES
      LABELS "pipeline;mpi" TIMEOUT 120 ENVIRONMENT "${XMP_SBP_ENV}")
  endforeach()
endforeach()

# Pure SBP deduction: accepted and refused signatures, one process.
add_executable(test_sbp_deduce test_sbp_deduce.c)
target_link_libraries(test_sbp_deduce PRIVATE xmesh_pipeline)
add_test(NAME pipeline.sbp.test_sbp_deduce COMMAND test_sbp_deduce)
set_tests_properties(pipeline.sbp.test_sbp_deduce PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)

# Allocation accounting (contract D), one process.
add_executable(test_sbp_mem test_sbp_mem.c)
target_link_libraries(test_sbp_mem PRIVATE xmesh_pipeline)
find_package(Threads REQUIRED)
target_link_libraries(test_sbp_mem PRIVATE Threads::Threads)
add_test(NAME pipeline.sbp.test_sbp_mem COMMAND test_sbp_mem)
set_tests_properties(pipeline.sbp.test_sbp_mem PROPERTIES LABELS "pipeline;unit" TIMEOUT 60
  ENVIRONMENT "${XMP_SBP_ENV}")

# A failing rank and a rank that never arrives: the others end with an error naming it (or
# the collective) within XMESH_TIMEOUT_S (3 s here) + margin, never hang, never abort.
add_executable(test_sbp_fail test_sbp_fail.c)
target_link_libraries(test_sbp_fail PRIVATE xmesh_pipeline)
add_test(NAME pipeline.sbp.test_sbp_fail.n4
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
          ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_sbp_fail> ${MPIEXEC_POSTFLAGS})
set_tests_properties(pipeline.sbp.test_sbp_fail.n4 PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
  ENVIRONMENT "${XMP_SBP_ENV};XMESH_TIMEOUT_S=3")
