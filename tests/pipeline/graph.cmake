# One graph per model (pipeline/nn/graph.{c,h}, models/gpt2_graph.c; issue 38 item 1): a tiny
# GPT's nodes, value classes, parameter count and FLOPs by hand, and the refusals.
add_executable(test_graph ${CMAKE_CURRENT_LIST_DIR}/test_graph.c)
target_include_directories(test_graph PRIVATE ${CMOCKA_INCLUDE_DIR})
target_link_libraries(test_graph PRIVATE xmesh_pipeline ${CMOCKA_LIBRARY})
add_test(NAME pipeline.graph COMMAND test_graph)
set_tests_properties(pipeline.graph PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
