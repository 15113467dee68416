# U-Transformer layout search (pipeline/search/search_ut.h, issue 21): coordinate descent +
# Metropolis-Hastings against exhaustive enumeration on small spaces, the memory refusal's
# exact smallest need, evaluation round trips, strategy names as data, errors (unit).
add_executable(test_pipeline_search_ut ${CMAKE_CURRENT_LIST_DIR}/test_search_ut.c)
target_link_libraries(test_pipeline_search_ut PRIVATE xmesh_pipeline xmesh_pipeline_internals)
add_test(NAME pipeline.search.ut COMMAND test_pipeline_search_ut)
set_tests_properties(pipeline.search.ut PROPERTIES LABELS "pipeline;unit" TIMEOUT 120)
# The public offline estimate (pipeline/search/estimate.h): equal to the search's model, per-rank
# memory, rank placement advice, errors; nominal and a calibrated cluster file (unit).
add_executable(test_pipeline_estimate ${CMAKE_CURRENT_LIST_DIR}/test_estimate.c)
target_link_libraries(test_pipeline_estimate PRIVATE xmesh_pipeline xmesh_pipeline_internals)
add_test(NAME pipeline.search.estimate COMMAND test_pipeline_estimate
         ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/cluster_file/calibrate_sections.txt)
set_tests_properties(pipeline.search.estimate PROPERTIES LABELS "pipeline;unit" TIMEOUT 60
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
# `xmesh-train utransformer plan` and `gpt plan --ablate`: table, JSON, exhaustive = search,
# --eval, the memory refusal's number, errors with their exit codes (unit).
if(TARGET xmesh-train)
  add_test(NAME pipeline.search.ut.cli
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/search21_cli_test.sh $<TARGET_FILE:xmesh-train>
            ${CMAKE_CURRENT_BINARY_DIR}/search21_cli)
  set_tests_properties(pipeline.search.ut.cli PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
endif()
