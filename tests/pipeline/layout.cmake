# Stage layouts (pure).
add_executable(test_stage_layout ${CMAKE_CURRENT_LIST_DIR}/test_stage_layout.c)
target_include_directories(test_stage_layout PRIVATE ${CMOCKA_INCLUDE_DIR})
target_link_libraries(test_stage_layout PRIVATE xmesh_pipeline ${CMOCKA_LIBRARY})
add_test(NAME pipeline.stage_layout COMMAND test_stage_layout)
set_tests_properties(pipeline.stage_layout PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
