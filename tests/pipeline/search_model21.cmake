# The layout search's element-wise compute term and the cluster file's eltwise records
# (issue 21, docs/SEARCH.md "Compute"): parse / write / errors, the term by hand, DP =
# exhaustive with it (unit, one process).
add_executable(test_pipeline_search_eltwise ${CMAKE_CURRENT_LIST_DIR}/test_search_eltwise.c)
target_link_libraries(test_pipeline_search_eltwise PRIVATE xmesh_pipeline xmesh_pipeline_internals)
add_test(NAME pipeline.search.eltwise COMMAND test_pipeline_search_eltwise)
set_tests_properties(pipeline.search.eltwise PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
# The chain DP against exhaustive enumeration with a cluster file that has measured collective
# points and eltwise records (written by xmesh-calibrate).
add_test(NAME pipeline.search.points COMMAND test_pipeline_search
         ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/cluster_file/calibrate_points_eltwise.txt)
set_tests_properties(pipeline.search.points PROPERTIES LABELS "pipeline;unit" TIMEOUT 120)
# CPU sharing between ranks in the search's model (cpuset records, xm_cost_cpu_share, the
# pipeline simulation with a stage's idle cpus lent to the stages that share them).
add_executable(test_pipeline_search_cpu ${CMAKE_CURRENT_LIST_DIR}/test_search_cpu.c)
target_link_libraries(test_pipeline_search_cpu PRIVATE xmesh_pipeline xmesh_pipeline_internals)
add_test(NAME pipeline.search.cpu COMMAND test_pipeline_search_cpu)
set_tests_properties(pipeline.search.cpu PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
