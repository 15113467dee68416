# U-Transformer (pipeline/models/utransformer.c, shapes_data.c). One process: finite-difference
# checks of the 13 layers and the whole model, data determinism/slicing, init, bad input.
# Replay a seed with: test_utrans_fd --seed N
add_executable(test_utrans_fd ${CMAKE_CURRENT_SOURCE_DIR}/test_utrans_fd.c)
target_link_libraries(test_utrans_fd PRIVATE xmesh_pipeline m)
add_test(NAME pipeline.utrans_fd COMMAND test_utrans_fd)
set_tests_properties(pipeline.utrans_fd PROPERTIES LABELS "pipeline;unit" TIMEOUT 60
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1")

# xmesh-train utransformer under mpiexec: every step's loss of the pipeline must equal the
# serial reference run on rank 0 (--check-serial: 1e-5 relative over steps 0-4, 1e-4 to step 9;
# the command exits non-zero and prints MISMATCH otherwise). Pass = exit status 0, which the
# command gives only after a complete run whose every compared step matched; a printed line is
# never the pass criterion (FAIL_REGULAR_EXPRESSION only adds a way to fail). Matrix: schedule x comm mode (signal moves no
# data, so it is excluded) on
#   s2    2 stages, 1 rank each (main edge + 3 skips cross the boundary)
#   s3dp  3 stages on 4 ranks, stage 0 data parallel (dp 2 -> dp 1 edges, skips to stage 2)
#   s3lay layout u*5|u*4|u*4, last stage dp 2 (skips from a 1x1 mesh to a 2x1 mesh)
# plus --delay-wgrad (I/W split) runs and bad-input checks.
if(TARGET xmesh-train)
  set(XMP_UT_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  set(XMP_UT_COMMON --base-channels 4 --steps 10 --check-serial --no-progress)
  function(xmp_ut_case name np)
    foreach(sched gpipe 1f1b eager-1f1b)
      foreach(comm broadcast sendrecv sendrecv-allgather blocking delay-wgrad)
        if(comm STREQUAL "delay-wgrad")
          set(extra --delay-wgrad)
        else()
          set(extra --comm ${comm})
        endif()
        set(t pipeline.utrans.${name}.${sched}.${comm})
        add_test(NAME ${t}
          COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                  ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xmesh-train> utransformer ${ARGN}
                  --schedule ${sched} ${extra} ${XMP_UT_COMMON} ${MPIEXEC_POSTFLAGS})
        set_tests_properties(${t} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
          ENVIRONMENT "${XMP_UT_ENV}" FAIL_REGULAR_EXPRESSION "MISMATCH|check-serial: FAILED")
      endforeach()
    endforeach()
  endfunction()
  xmp_ut_case(s2 2 --stages 2 --batch 4 --microbatches 2)
  xmp_ut_case(s3dp 4 --stages 3 --stage-dp 2,1,1 --batch 8 --microbatches 4)
  xmp_ut_case(s3lay 4 --layout "u*5|u*4|u*4" --stage-dp 1,1,2 --batch 8 --microbatches 4)
  # Tensor parallel (--strategy megatron, the default: channel split through the nn/ SBP ops,
  # models/utransformer_sbp.h): one stage on 1x2 and 2x2
  # (dp x tp), and two stages whose meshes differ in shape (1x2 -> 2x1, 2x1 -> 1x2) so the main
  # edge and the skips go between a tensor-parallel and a data-parallel mesh; every comm mode
  # once, each with a different schedule.
  function(xmp_ut_tp_case name np)
    add_test(NAME pipeline.utrans.tp.${name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xmesh-train> utransformer ${XMP_UT_COMMON}
              ${ARGN} ${MPIEXEC_POSTFLAGS})
    set_tests_properties(pipeline.utrans.tp.${name} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
      ENVIRONMENT "${XMP_UT_ENV}" FAIL_REGULAR_EXPRESSION "MISMATCH|check-serial: FAILED")
  endfunction()
  xmp_ut_tp_case(s1_1x2 2 --stages 1 --stage-tp 2 --batch 4)
  xmp_ut_tp_case(s1_2x2 4 --stages 1 --stage-mesh 2x2 --batch 4)
  # the dp strategy on a tp mesh (every parameter replicated, activations S(0),B) and a
  # strategy read from a file (megatron's text with the attention replicated everywhere)
  xmp_ut_tp_case(s1_1x2_dp 2 --stages 1 --stage-tp 2 --batch 4 --strategy dp)
  xmp_ut_tp_case(s1_2x2_file 4 --stages 1 --stage-mesh 2x2 --batch 4
                 --strategy ${CMAKE_CURRENT_LIST_DIR}/utrans_strategy_noattn.txt)
  set(XMP_UT_TP2 --stages 2 --batch 4 --microbatches 2)
  xmp_ut_tp_case(s2_1x2_2x1.gpipe.broadcast 4 ${XMP_UT_TP2} --stage-mesh 1x2,2x1
                 --schedule gpipe --comm broadcast)
  xmp_ut_tp_case(s2_1x2_2x1.1f1b.sendrecv 4 ${XMP_UT_TP2} --stage-mesh 1x2,2x1
                 --schedule 1f1b --comm sendrecv)
  xmp_ut_tp_case(s2_2x1_1x2.eager-1f1b.sendrecv-allgather 4 ${XMP_UT_TP2} --stage-mesh 2x1,1x2
                 --schedule eager-1f1b --comm sendrecv-allgather)
  xmp_ut_tp_case(s2_2x1_1x2.1f1b.blocking 4 ${XMP_UT_TP2} --stage-mesh 2x1,1x2
                 --schedule 1f1b --comm blocking)
  xmp_ut_tp_case(s2_1x2_2x1.eager-1f1b.delay-wgrad 4 ${XMP_UT_TP2} --stage-mesh 1x2,2x1
                 --schedule eager-1f1b --delay-wgrad)
  # Bad input: a clear message naming the values (the command exits non-zero).
  # group norm groups 3 over tp 2: a group spans the two ranks (statistics all-reduced)
  xmp_ut_tp_case(s1_1x2_groups3 2 --stages 1 --stage-tp 2 --base-channels 6 --groups 3
                 --batch 4)
  # Bad input: test_utrans_expect_fail.sh passes only on a clean non-zero exit AND the message.
  # bad_tp: a strategy file splitting every attention's heads over tp 2, where down1 has 1 head.
  set(XMP_UT_EXPECT_FAIL sh ${CMAKE_CURRENT_LIST_DIR}/test_utrans_expect_fail.sh)
  add_test(NAME pipeline.utrans.bad_tp
    COMMAND ${XMP_UT_EXPECT_FAIL}
            "stage 0: strategy megatron-allheads, layer down1: attention heads 1 not divisible by the 2 channel pieces"
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:xmesh-train> utransformer --stages 1 --stage-tp 2 --base-channels 4
            --strategy ${CMAKE_CURRENT_LIST_DIR}/utrans_strategy_allheads.txt --batch 4
            --steps 1 ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.utrans.bad_tp PROPERTIES LABELS "pipeline;mpi" TIMEOUT 30
    ENVIRONMENT "${XMP_UT_ENV}")
  add_test(NAME pipeline.utrans.bad_strategy
    COMMAND ${XMP_UT_EXPECT_FAIL} "strategy 'nosuch': no such file and no built-in of that name (built-ins: dp, megatron, 3d, axonn)"
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:xmesh-train> utransformer --stages 1 --stage-tp 2 --strategy nosuch
            --batch 4 --steps 1 ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.utrans.bad_strategy PROPERTIES LABELS "pipeline;mpi" TIMEOUT 30
    ENVIRONMENT "${XMP_UT_ENV}")
  add_test(NAME pipeline.utrans.bad_groups
    COMMAND ${XMP_UT_EXPECT_FAIL} "groups 4: must divide the base channels 6"
            $<TARGET_FILE:xmesh-train> utransformer --serial --base-channels 6 --groups 4)
  set_tests_properties(pipeline.utrans.bad_groups PROPERTIES LABELS "pipeline;unit" TIMEOUT 30)
endif()

# U-Transformer layers on SBP tensors, layer by layer (test_utrans_tp.c): each of the 13 layers
# under the dp and megatron strategies on 1 x tp (tp = 2, 4) and 2 x 2 meshes equals the serial
# layer (outputs, input gradients, reduced parameter gradients, all gathered), and the strategy
# refusals. Replay: test_utrans_tp --seed N
add_executable(test_utrans_tp ${CMAKE_CURRENT_SOURCE_DIR}/test_utrans_tp.c)
target_link_libraries(test_utrans_tp PRIVATE xmesh_pipeline m)
foreach(np 2 4)
  add_test(NAME pipeline.utrans_tp.np${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:test_utrans_tp> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.utrans_tp.np${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
endforeach()

# --delay-wgrad re-planning after the first step (pipe/replan.h) and gpt's step JSON keys.
if(TARGET xmesh-train)
  add_test(NAME pipeline.utrans.replan
           COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_utrans_replan.py
                   $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
  set_tests_properties(pipeline.utrans.replan PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
endif()

# SBP forms of the U-Transformer layers (nn/sbp_conv.h) on 1, 2 and 4 ranks (1-D meshes, and a
# 2x2 mesh on 4): every output and gradient against nn/unet_kernels element by element, finite
# differences through the SBP forward, and the refusals. Replay: test_utrans_sbp --seed N
add_executable(test_utrans_sbp ${CMAKE_CURRENT_SOURCE_DIR}/test_utrans_sbp.c)
target_link_libraries(test_utrans_sbp PRIVATE xmesh_pipeline m)
foreach(np 1 2 4)
  add_test(NAME pipeline.utrans_sbp.np${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:test_utrans_sbp> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.utrans_sbp.np${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
endforeach()
