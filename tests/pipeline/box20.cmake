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

# GPT-2's control messages (gather, status agreement) end with an error naming a failed rank,
# or a timeout, never a hang (4 ranks, XMESH_TIMEOUT_S=3).
add_executable(test_gpt_fail test_gpt_fail.c)
target_link_libraries(test_gpt_fail PRIVATE xmesh_pipeline)
add_test(NAME pipeline.box20.gpt_fail.n4
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
          ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_gpt_fail> ${MPIEXEC_POSTFLAGS})
set_tests_properties(pipeline.box20.gpt_fail.n4 PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
  ENVIRONMENT "${XMP_BOX20_ENV};XMESH_TIMEOUT_S=3")

# Collective matmul, GEMM then collective (nn/overlap.h (e)): serial reference, on == off
# bitwise, pieces really used; .break must fail.
add_executable(test_overlap_cmbox test_overlap_cmbox.c)
target_link_libraries(test_overlap_cmbox PRIVATE xmesh_pipeline)
foreach(np 4 8)
  add_test(NAME pipeline.box20.cmbox.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_overlap_cmbox> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.box20.cmbox.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
    ENVIRONMENT "${XMP_BOX20_ENV}")
endforeach()
add_test(NAME pipeline.box20.cmbox.break
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
          ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_overlap_cmbox> ${MPIEXEC_POSTFLAGS} --break)
set_tests_properties(pipeline.box20.cmbox.break PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
  WILL_FAIL TRUE ENVIRONMENT "${XMP_BOX20_ENV}")

# GPT-2 losses with each overlap switch (coll-matmul among them) equal to none, on a 4-rank
# tensor axis (4-rank all-reduce in pieces) and the 3-D signature on 2x2x2 (shared splits).
if(TARGET xmesh-train)
  foreach(c megatron.1x4 3d.2x2x2)
    add_test(NAME pipeline.box20.overlap_gpt.${c}
      COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_overlap_gpt.py ${c}
              $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.box20.overlap_gpt.${c} PROPERTIES LABELS "pipeline;mpi"
      TIMEOUT 120 ENVIRONMENT "${XMP_BOX20_ENV}")
  endforeach()
  add_test(NAME pipeline.box20.overlap_gpt.break
    COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_overlap_gpt.py megatron.1x4
            $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE} --break)
  set_tests_properties(pipeline.box20.overlap_gpt.break PROPERTIES LABELS "pipeline;mpi"
    TIMEOUT 120 WILL_FAIL TRUE ENVIRONMENT "${XMP_BOX20_ENV}")
endif()
