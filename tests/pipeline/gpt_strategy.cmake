# Strategies as data (pipeline/nn/strategy.{c,h}) and GPT-2 stages driven by them.
add_executable(test_strategy ${CMAKE_CURRENT_LIST_DIR}/test_strategy.c)
target_include_directories(test_strategy PRIVATE ${CMOCKA_INCLUDE_DIR})
target_link_libraries(test_strategy PRIVATE xmesh_pipeline ${CMOCKA_LIBRARY})
add_test(NAME pipeline.strategy COMMAND test_strategy)
set_tests_properties(pipeline.strategy PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
