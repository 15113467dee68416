# Issue 23 follow-ups (test_sched23.py): virtual stages with --grad-clip / --val-every /
# --sample-every against the serial run (vloop, GPT-2), and the U-Transformer's
# --max-activation-bytes (ucap).
if(TARGET xmesh-train)
  foreach(set vloop ucap)
    add_test(NAME pipeline.sched23.${set}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_sched23.py ${set}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.sched23.${set} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 300
                         ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endif()
# The memory model's per-group base (xmp_sim_costs_t.base_bytes) and the cap that counts it.
add_executable(test_pipeline_sched_base ${CMAKE_CURRENT_LIST_DIR}/test_sched_base.c)
target_link_libraries(test_pipeline_sched_base PRIVATE xmesh_pipeline m)
add_test(NAME pipeline.sched23.base COMMAND test_pipeline_sched_base)
set_tests_properties(pipeline.sched23.base PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
