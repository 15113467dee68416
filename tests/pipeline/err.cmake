# The caller-buffer error formatter (pipeline/util/xmp_err.h) and the SBP rule messages built on
# it: pure, one process.
add_executable(test_xmp_err ${CMAKE_CURRENT_LIST_DIR}/test_xmp_err.c)
target_include_directories(test_xmp_err PRIVATE ${CMOCKA_INCLUDE_DIR})
target_link_libraries(test_xmp_err PRIVATE xmesh_pipeline ${CMOCKA_LIBRARY})
add_test(NAME pipeline.xmp_err COMMAND test_xmp_err)
set_tests_properties(pipeline.xmp_err PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
