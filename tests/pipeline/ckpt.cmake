# Distributed checkpoints (pipeline/ckpt) under MPI, and the xmesh-ckpt tool.
set(XMP_CKPT_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt.c)
  add_executable(test_ckpt test_ckpt.c)
  target_link_libraries(test_ckpt PRIVATE xmesh_pipeline)
  foreach(np 1 3 8)
    add_test(NAME pipeline.ckpt.n${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_ckpt> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(pipeline.ckpt.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "${XMP_CKPT_ENV}")
  endforeach()
  # the loader's plans of many: one plan per tensor, and plans of a few tensors each
  foreach(pb 0 512)
    add_test(NAME pipeline.ckpt.n3.planbytes${pb}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_ckpt> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(pipeline.ckpt.n3.planbytes${pb} PROPERTIES LABELS "pipeline;mpi"
      TIMEOUT 120 ENVIRONMENT "${XMP_CKPT_ENV};XMESH_CKPT_PLAN_BYTES=${pb}")
  endforeach()
  if(TARGET xmesh-ckpt)
    add_test(NAME pipeline.ckpt.info
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_info_test.sh ${MPIEXEC_EXECUTABLE}
              $<TARGET_FILE:test_ckpt> $<TARGET_FILE:xmesh-ckpt>)
    set_tests_properties(pipeline.ckpt.info PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "${XMP_CKPT_ENV}")
    add_test(NAME pipeline.ckpt.crash
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_crash_test.sh ${MPIEXEC_EXECUTABLE}
              $<TARGET_FILE:test_ckpt> $<TARGET_FILE:xmesh-ckpt>)
    set_tests_properties(pipeline.ckpt.crash PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "${XMP_CKPT_ENV}")
  endif()
endif()
