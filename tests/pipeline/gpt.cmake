# GPT-2 serial compute: kernels, llm.c formats, serial model, xmesh-train gpt/tokenize.
add_executable(test_pipeline_kernels ${CMAKE_CURRENT_LIST_DIR}/test_kernels.c)
target_link_libraries(test_pipeline_kernels PRIVATE xmesh_pipeline)
add_test(NAME pipeline.kernels COMMAND test_pipeline_kernels)
set_tests_properties(pipeline.kernels PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)

add_executable(test_pipeline_gpt_serial ${CMAKE_CURRENT_LIST_DIR}/test_gpt_serial.c)
target_link_libraries(test_pipeline_gpt_serial PRIVATE xmesh_pipeline)
add_test(NAME pipeline.gpt_serial COMMAND test_pipeline_gpt_serial
  --tmp ${CMAKE_CURRENT_BINARY_DIR}/gpt_serial_tmp)
set_tests_properties(pipeline.gpt_serial PROPERTIES LABELS "pipeline;unit" TIMEOUT 120)

if(TARGET xmesh-train)
  find_program(XMP_PYTHON3 python3)
  add_test(NAME pipeline.gpt_cli
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/gpt_cli_test.sh $<TARGET_FILE:xmesh-train>
            ${CMAKE_CURRENT_BINARY_DIR}/gpt_cli_tmp ${XMP_PYTHON3})
  set_tests_properties(pipeline.gpt_cli PROPERTIES LABELS "pipeline;unit" TIMEOUT 120)
endif()
