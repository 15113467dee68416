# The one trainer (apps/trainer.h): --grad-accum, --grad-clip and the learning-rate schedule
# in parallel layouts of both models against the serial reference (test_train_loop.py: exit
# status, per-step losses, learning rates and global gradient norms of both runs' JSON).
if(TARGET xmesh-train)
  foreach(case gpt.pipe_dp_tp gpt.megatron_2x2 gpt.axonn_1x2x2 gpt.pipe3_20 ut.pipe_tp_dp
               ut.s3dp_20)
    add_test(NAME pipeline.trainer.loop.${case}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_train_loop.py ${case}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.trainer.loop.${case} PROPERTIES LABELS "pipeline;mpi"
                         TIMEOUT 300)
  endforeach()
endif()
