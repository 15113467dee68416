# Parallel GPT-2 against the serial reference (xmesh-train gpt --check-serial).
if(TARGET xmesh-train)
  foreach(set mesh s2 s3 s4 signal)
    add_test(NAME pipeline.gpt_par.${set}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_gpt_par.py ${set}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.gpt_par.${set} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 900
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  endforeach()
endif()
