# Pipeline schedules (pure, one process): generators, text form, validator,
# deadlock dry run, timed simulator, timeline.
add_executable(test_pipeline_schedule ${CMAKE_CURRENT_LIST_DIR}/test_schedule.c)
target_link_libraries(test_pipeline_schedule PRIVATE xmesh_pipeline)
add_test(NAME pipeline.schedule COMMAND test_pipeline_schedule)
set_tests_properties(pipeline.schedule PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
# Virtual-stage schedules (interleaved 1F1B, ZB-V, V-1F1B), recomputation, memory cap.
add_executable(test_pipeline_sched_virtual ${CMAKE_CURRENT_LIST_DIR}/test_sched_virtual.c)
target_link_libraries(test_pipeline_sched_virtual PRIVATE xmesh_pipeline m)
add_test(NAME pipeline.sched.virtual COMMAND test_pipeline_sched_virtual)
set_tests_properties(pipeline.sched.virtual PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
# xmesh-train schedule: simulated steps against hand-computed timelines, refusals.
if(TARGET xmesh-train)
  add_test(NAME pipeline.schedule.cli
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/schedule_cli_test.sh $<TARGET_FILE:xmesh-train>
            ${CMAKE_CURRENT_BINARY_DIR}/schedule_cli)
  set_tests_properties(pipeline.schedule.cli PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
endif()
