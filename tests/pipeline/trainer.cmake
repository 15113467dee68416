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
# Sampling is GPT's: the U-Transformer refuses it with a clear message.
if(TARGET xmesh-train)
  add_test(NAME pipeline.trainer.ut_sample_refused
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_utrans_expect_fail.sh
            "--sample-every 2: the utransformer model does not generate text"
            $<TARGET_FILE:xmesh-train> utransformer --serial --base-channels 4 --steps 2
            --sample-every 2)
  set_tests_properties(pipeline.trainer.ut_sample_refused PROPERTIES LABELS "pipeline;unit"
                       TIMEOUT 30)
endif()
# Strategies of both models through nn/strategy.h and the common flags: the U-Transformer with
# one strategy per stage (--stage-strategy) equals the serial reference (exit status 0 only
# after every step matched), and its printed built-in loads back from a file to the same run.
if(TARGET xmesh-train)
  set(XMP_TR_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  add_test(NAME pipeline.trainer.ut_stage_strategy
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:xmesh-train> utransformer --base-channels 4 --batch 4 --microbatches 2
            --stage-mesh 1x2,2x1 --stage-strategy megatron,dp --steps 5 --check-serial
            --no-progress ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.trainer.ut_stage_strategy PROPERTIES LABELS "pipeline;mpi"
    TIMEOUT 60 ENVIRONMENT "${XMP_TR_ENV}" FAIL_REGULAR_EXPRESSION "MISMATCH|check-serial: FAILED")
  add_test(NAME pipeline.trainer.ut_stage_strategy_count
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_utrans_expect_fail.sh
            "--stage-strategy 'dp,dp,dp' has 3 entries for 2 stages"
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:xmesh-train> utransformer --base-channels 4 --batch 4 --stages 2
            --stage-strategy dp,dp,dp --steps 1 ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.trainer.ut_stage_strategy_count PROPERTIES LABELS "pipeline;mpi"
    TIMEOUT 30 ENVIRONMENT "${XMP_TR_ENV}")
endif()
# Bad values of the loop flags: a clean refusal naming the flag and the value.
if(TARGET xmesh-train)
  set(XMP_TR_FAIL sh ${CMAKE_CURRENT_LIST_DIR}/test_utrans_expect_fail.sh)
  foreach(c
      "lr_decay|--lr-decay 'step': expected none, cosine or linear|gpt;--serial;--lr-decay;step"
      "lr_min_frac|--lr-min-frac '2'|gpt;--serial;--lr-min-frac;2"
      "warmup|--warmup 50 is longer than --steps 3|utransformer;--serial;--warmup;50;--steps;3"
      "grad_accum|--grad-accum '0'|gpt;--serial;--grad-accum;0"
      "val_data|--val-every 2 with --data 'x.bin': give the held-out split with --val-data|gpt;--serial;--val-every;2;--data;x.bin"
      "sample_len|--sample-len 64: at most --seq - 1 = 63 tokens|gpt;--serial;--layers;1;--channels;32;--steps;1;--sample-every;1;--sample-len;64")
    string(REPLACE "|" ";" parts "${c}")
    list(GET parts 0 name)
    list(GET parts 1 want)
    list(SUBLIST parts 2 -1 args)
    add_test(NAME pipeline.trainer.bad.${name}
             COMMAND ${XMP_TR_FAIL} "${want}" $<TARGET_FILE:xmesh-train> ${args})
    set_tests_properties(pipeline.trainer.bad.${name} PROPERTIES LABELS "pipeline;unit" TIMEOUT 30)
  endforeach()
endif()
# U-Transformer stage meshes of more than 4 axes are refused by name.
if(TARGET xmesh-train)
  # 1-4 axis stage meshes run (pipeline.utrans_strategy.*); a fifth axis is refused
  add_test(NAME pipeline.trainer.ut_nd_mesh_refused
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_utrans_expect_fail.sh
            "stage 0: expected a mesh AxB.. of 1 to 4 positive axis sizes"
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:xmesh-train> utransformer --base-channels 4 --batch 4
            --stage-mesh 1x1x1x1x2 --steps 1 ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.trainer.ut_nd_mesh_refused PROPERTIES LABELS "pipeline;mpi"
    TIMEOUT 30 ENVIRONMENT "${XMP_TR_ENV}")
endif()

# A rank that fails mid-step (--inject-fail STEP:RANK): every rank ends with an error naming it,
# well before XMESH_TIMEOUT_S (60 s; the job must end within 40 s: the failure notice ends the
# boxing collectives and, through xmesh's abort check, the cross-stage transfers waiting on the
# failed rank), and --check-serial reports FAILED for the incomplete run. GPT on 2 stages x 2 ranks (rank 3, the last stage, fails at step 1) and the U-Transformer
# on 2 stages (rank 1, in the first stage, fails at step 2).
if(TARGET xmesh-train)
  set(XMP_INJ sh ${CMAKE_CURRENT_LIST_DIR}/test_inject_fail.sh)
  add_test(NAME pipeline.trainer.inject_fail.gpt
    COMMAND ${XMP_INJ} 4 3 60 40 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xmesh-train> gpt --layers 2 --heads 4 --channels 32
            --seq 16 --batch 4 --stage-mesh 2,2 --microbatches 2 --steps 4 --no-progress
            --check-serial --inject-fail 1:3)
  add_test(NAME pipeline.trainer.inject_fail.ut
    COMMAND ${XMP_INJ} 4 1 60 40 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xmesh-train> utransformer --base-channels 4
            --batch 4 --stages 2 --stage-mesh 1x2,2 --stage-strategy megatron,dp
            --microbatches 2 --steps 4 --no-progress --inject-fail 2:1)
  set_tests_properties(pipeline.trainer.inject_fail.gpt pipeline.trainer.inject_fail.ut
    PROPERTIES LABELS "pipeline;mpi" TIMEOUT 90
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
endif()

# xmesh-train keeps freed memory (apps/main.c): the same losses as with glibc's defaults
# (XMESH_KEEP_FREED=0) and at most a tenth of their page faults per step after the first two;
# a bad XMESH_KEEP_FREED is named in a warning.
if(TARGET xmesh-train)
  add_test(NAME pipeline.trainer.keep_freed
    COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_keep_freed.py
            ${CMAKE_CURRENT_BINARY_DIR}/keep_freed ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG}
            $<TARGET_FILE:xmesh-train> --oversubscribe ${MPIEXEC_PREFLAGS})
  set_tests_properties(pipeline.trainer.keep_freed PROPERTIES LABELS "pipeline;mpi" TIMEOUT 300
    SKIP_RETURN_CODE 77
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
endif()
