# U-Transformer (pipeline/models/utransformer.c, shapes_data.c). One process: finite-difference
# checks of the 13 layers and the whole model, data determinism/slicing, init, bad input.
# Replay a seed with: test_utrans_fd --seed N
add_executable(test_utrans_fd ${CMAKE_CURRENT_SOURCE_DIR}/test_utrans_fd.c)
target_link_libraries(test_utrans_fd PRIVATE xmesh_pipeline m)
add_test(NAME pipeline.utrans_fd COMMAND test_utrans_fd)
set_tests_properties(pipeline.utrans_fd PROPERTIES LABELS "pipeline;unit" TIMEOUT 60
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
