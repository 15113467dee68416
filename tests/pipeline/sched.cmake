# Pipeline schedules (pure, one process): generators, text form, validator,
# deadlock dry run, timed simulator, timeline.
add_executable(test_pipeline_schedule ${CMAKE_CURRENT_LIST_DIR}/test_schedule.c)
target_link_libraries(test_pipeline_schedule PRIVATE xmesh_pipeline)
add_test(NAME pipeline.schedule COMMAND test_pipeline_schedule)
set_tests_properties(pipeline.schedule PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
