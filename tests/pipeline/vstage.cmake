# Virtual stages and recomputation (issue 23), GPT-2 (r2 r3 r4 long cap bad) and the
# U-Transformer (ut2 ut3 ut4), against the serial reference
# (xmesh-train gpt --check-serial, parameters after the run compared too).
if(TARGET xmesh-train)
  foreach(set r2 r3 r4 long cap bad ut2 ut3 ut4)
    add_test(NAME pipeline.vstage.${set}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_vstage.py ${set}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.vstage.${set} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 600
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endif()
