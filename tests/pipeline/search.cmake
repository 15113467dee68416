# Layout search (pipeline/search, issue 21): DP against exhaustive enumeration,
# model terms by hand, results that build, errors (unit, one process); the
# `xmesh-train gpt plan` command line: table, JSON, errors (malformed cluster
# file, ranks, memory limit), each message checked.
add_executable(test_pipeline_search ${CMAKE_CURRENT_LIST_DIR}/test_search.c)
target_link_libraries(test_pipeline_search PRIVATE xmesh_pipeline xmesh_pipeline_internals)
add_test(NAME pipeline.search COMMAND test_pipeline_search
         ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/cluster_file/calibrate_sections.txt)
set_tests_properties(pipeline.search PROPERTIES LABELS "pipeline;unit" TIMEOUT 120)
if(TARGET xmesh-train)
  add_test(NAME pipeline.search.cli
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/search_cli_test.sh $<TARGET_FILE:xmesh-train>
            ${CMAKE_CURRENT_BINARY_DIR}/search_cli)
  set_tests_properties(pipeline.search.cli PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
endif()
# The memory model against the allocations of real runs (mpi, <= 8 ranks, 2 steps), and
# --strategy auto (the plan's best, trained against the serial model).
if(TARGET xmesh-train)
  foreach(c megatron.pipe 3d.gpipe mixed.eager axonn auto)
    add_test(NAME pipeline.search.memory.${c}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_search_memory.py ${c}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.search.memory.${c} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endif()
