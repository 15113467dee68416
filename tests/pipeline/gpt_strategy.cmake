# Strategies as data (pipeline/nn/strategy.{c,h}) and GPT-2 stages driven by them.
add_executable(test_strategy ${CMAKE_CURRENT_LIST_DIR}/test_strategy.c)
target_include_directories(test_strategy PRIVATE ${CMOCKA_INCLUDE_DIR})
target_link_libraries(test_strategy PRIVATE xmesh_pipeline ${CMOCKA_LIBRARY})
add_test(NAME pipeline.strategy COMMAND test_strategy)
set_tests_properties(pipeline.strategy PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)

# GPT-2 with every built-in strategy on meshes of 1-4 axes, pipelines mixing strategies and
# mesh shapes (each against the serial reference over 5 steps), and the refusals.
if(TARGET xmesh-train)
  set(XMP_GS_CASES
    dp.4 dp.2x2 dp.2x2x2 dp.2x1x2x2
    megatron.2 megatron.2x2 megatron.2x2x2 megatron.2x1x2x2
    3d.2 3d.2x2 3d.2x2x2 3d.1x2x2 3d.3x1x2 3d.2x1x2x2
    pipe.3d-megatron pipe.dp-megatron-3d pipe.3d-dp.4axes pipe.megatron-3d.layout
    print.roundtrip
    refuse.unknown_class refuse.missing_class refuse.axis_count refuse.bad_sbp refuse.param_dim
    refuse.rule_partial_x refuse.rule_attention refuse.rule_attention_hs refuse.rule_partial_param
    refuse.heads custom.channel_layernorm custom.sequence_attention custom.pipeline_sequence
    refuse.axonn refuse.unknown_name refuse.stage_count refuse.store_partial refuse.store_activation
    axonn.2x2x2 axonn.1x2x2 axonn.2x1x2x2 pipe.axonn-axonn.tied pipe.axonn-megatron custom.zero
    memory.axonn long.3d.2x2x2 long.axonn-megatron
    ov.megatron.2 ov.3d.2x1x2x2 ov.axonn.2x2x2 ov.pipe.3d-megatron ov.pipe.dp-megatron-3d
    long.ov.axonn-megatron)
  foreach(c ${XMP_GS_CASES})
    add_test(NAME pipeline.gpt_strategy.${c}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_gpt_strategy.py ${c}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.gpt_strategy.${c} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endif()
