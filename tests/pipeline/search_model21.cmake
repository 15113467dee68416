# The layout search's element-wise compute term and the cluster file's eltwise records
# (issue 21, docs/SEARCH.md "Compute"): parse / write / errors, the term by hand, DP =
# exhaustive with it (unit, one process).
add_executable(test_pipeline_search_eltwise ${CMAKE_CURRENT_LIST_DIR}/test_search_eltwise.c)
target_link_libraries(test_pipeline_search_eltwise PRIVATE xmesh_pipeline)
add_test(NAME pipeline.search.eltwise COMMAND test_pipeline_search_eltwise)
set_tests_properties(pipeline.search.eltwise PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
