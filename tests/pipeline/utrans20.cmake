# U-Transformer strategies through nn/strategy.h (issue 20): the 3-D built-ins (3d, axonn) and the
# others on meshes of 3 and 4 axes, sharded storage (axonn's depth shard, a ZeRO-style custom
# strategy) through nn/param.h, 2- and 3-stage pipelines mixing strategies and mesh shapes, every
# overlap switch on 1- to 4-axis meshes, each
# against the serial reference per step over 5 steps (--check-serial, 1e-5 relative); the bytes
# per rank; 20 steps with every overlap switch (1e-5 over 5 steps, 1e-4 over 20); the text round trip; the refusals naming class, layer, axis and rule.
# Pass = the script's exit status (run cases: the command's exit 0 AND 5 steps compared).
if(TARGET xmesh-train)
  set(XMP_UT20_CASES
    3d.4 3d.2x2 megatron.4 3d.2x2x2 3d.1x2x2 3d.2x1x2x2 megatron.2x2x2 dp.1x2x2x2
    axonn.2x2x2 axonn.1x2x2 axonn.2x1x2x2 axonn.1x2x2x2
    pipe.3d-megatron pipe.axonn-dp pipe.dp-3d.4axes
    dp.4 dp.2x1x2 megatron.2x1x2x2 pipe3.megatron-3d-dp pipe3.axonn-megatron-3d.ov
    ov.megatron.4 ov.3d.2x1x2x2 short.mesh short.dp-tp
    custom.zero memory.axonn print.roundtrip long.3d.2x2x2 long.axonn-megatron
    resume.axonn-3d resume.megatron-axonn resume.pipe-axonn
    refuse.spatial refuse.concat refuse.partial refuse.store_partial refuse.store_activation
    refuse.param_dim refuse.unknown_class refuse.heads refuse.axonn_axes)
  foreach(c ${XMP_UT20_CASES})
    add_test(NAME pipeline.utrans_strategy.${c}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_utrans_strategy.py ${c}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.utrans_strategy.${c} PROPERTIES LABELS "pipeline;mpi"
      TIMEOUT 60
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endif()

# The shared sharded-parameter engine (nn/param.h) on a 2x2 mesh: every element of the compute
# copy, the stored shard, the reduced gradient and the gathered copy, the byte counts, the
# refusals. Replay: test_nn_param --seed N
add_executable(test_nn_param ${CMAKE_CURRENT_LIST_DIR}/test_nn_param.c)
target_link_libraries(test_nn_param PRIVATE xmesh_pipeline m)
add_test(NAME pipeline.param.np4
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:test_nn_param> ${MPIEXEC_POSTFLAGS})
set_tests_properties(pipeline.param.np4 PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
