# Overlap inside a stage (nn/overlap.h): nonblocking boxing and the overlap switches give the
# same bits as the blocking, non-overlapped ops. The .break case corrupts one result on
# purpose and must fail.
set(XMP_OVERLAP_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_overlap.c)
  add_executable(test_overlap test_overlap.c)
  target_link_libraries(test_overlap PRIVATE xmesh_pipeline)
  foreach(np 1 2 4 6 8)
    add_test(NAME pipeline.overlap.n${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_overlap> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(pipeline.overlap.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "${XMP_OVERLAP_ENV}")
  endforeach()
  add_test(NAME pipeline.overlap.break
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_overlap> --break ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.overlap.break PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
    WILL_FAIL TRUE ENVIRONMENT "${XMP_OVERLAP_ENV}")
endif()

# GPT-2 trained with every overlap switch on vs off: per-step losses within 1e-6 relative.
if(TARGET xmesh-train)
  set(XMP_OVERLAP_GPT ${CMAKE_CURRENT_SOURCE_DIR}/test_overlap_gpt.py)
  foreach(c megatron.2x2 3d.1x2x2 axonn.2x1x2 pipe.3d-megatron pipe.megatron-axonn.delay)
    add_test(NAME pipeline.overlap.gpt.${c}
      COMMAND python3 ${XMP_OVERLAP_GPT} ${c} $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.overlap.gpt.${c} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "${XMP_OVERLAP_ENV}")
  endforeach()
  add_test(NAME pipeline.overlap.gpt.break
    COMMAND python3 ${XMP_OVERLAP_GPT} megatron.2x2 $<TARGET_FILE:xmesh-train>
            ${MPIEXEC_EXECUTABLE} --break)
  set_tests_properties(pipeline.overlap.gpt.break PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
    WILL_FAIL TRUE ENVIRONMENT "${XMP_OVERLAP_ENV}")
endif()

# Nonblocking boxing under a remote failure and a timeout (4 ranks, XMESH_TIMEOUT_S=3).
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_overlap_fail.c)
  add_executable(test_overlap_fail test_overlap_fail.c)
  target_link_libraries(test_overlap_fail PRIVATE xmesh_pipeline)
  add_test(NAME pipeline.overlap.fail.n4
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_overlap_fail> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.overlap.fail.n4 PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
    ENVIRONMENT "${XMP_OVERLAP_ENV};XMESH_TIMEOUT_S=3")
endif()
