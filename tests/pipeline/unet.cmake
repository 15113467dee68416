# U-Transformer kernels (pipeline/nn/unet_kernels.c): finite-difference gradient checks, a naive
# direct convolution reference, im2col/col2im adjointness and the channel-split identities.
# One process. Replay a seed with: test_unet_kernels --seed N
add_executable(test_unet_kernels ${CMAKE_CURRENT_SOURCE_DIR}/test_unet_kernels.c)
target_link_libraries(test_unet_kernels PRIVATE xmesh_pipeline m)
add_test(NAME pipeline.unet_kernels COMMAND test_unet_kernels)
set_tests_properties(pipeline.unet_kernels PROPERTIES LABELS "pipeline;unit" TIMEOUT 60
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
