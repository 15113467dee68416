# Checkpoint / resume / convert through xmesh-train and xmesh-ckpt (issue 22).
if(TARGET xmesh-train AND TARGET xmesh-ckpt)
  find_program(XMP_RESUME_PYTHON3 python3)
  set(XMP_RESUME_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  foreach(set gpt_same gpt_other gpt_bad gpt_convert ut_same ut_other ut_bad)
    add_test(NAME pipeline.resume.${set}
      COMMAND ${XMP_RESUME_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_resume.py ${set}
              $<TARGET_FILE:xmesh-train> $<TARGET_FILE:xmesh-ckpt> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.resume.${set} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 240
      ENVIRONMENT "${XMP_RESUME_ENV}")
  endforeach()
endif()
