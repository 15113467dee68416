# Layout search (pipeline/search, issue 21): DP against exhaustive enumeration,
# model terms by hand, results that build, errors (unit, one process); the
# `xmesh-train gpt plan` command line: table, JSON, errors (malformed cluster
# file, ranks, memory limit), each message checked.
add_executable(test_pipeline_search ${CMAKE_CURRENT_LIST_DIR}/test_search.c)
target_link_libraries(test_pipeline_search PRIVATE xmesh_pipeline)
add_test(NAME pipeline.search COMMAND test_pipeline_search)
set_tests_properties(pipeline.search PROPERTIES LABELS "pipeline;unit" TIMEOUT 120)
if(TARGET xmesh-train)
  add_test(NAME pipeline.search.cli
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/search_cli_test.sh $<TARGET_FILE:xmesh-train>
            ${CMAKE_CURRENT_BINARY_DIR}/search_cli)
  set_tests_properties(pipeline.search.cli PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
endif()
