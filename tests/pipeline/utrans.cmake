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
# the command fails and prints MISMATCH otherwise). Matrix: schedule x comm mode (signal moves no
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
          ENVIRONMENT "${XMP_UT_ENV}" PASS_REGULAR_EXPRESSION "check-serial: OK"
          FAIL_REGULAR_EXPRESSION "MISMATCH")
      endforeach()
    endforeach()
  endfunction()
  xmp_ut_case(s2 2 --stages 2 --batch 4 --microbatches 2)
  xmp_ut_case(s3dp 4 --stages 3 --stage-dp 2,1,1 --batch 8 --microbatches 4)
  xmp_ut_case(s3lay 4 --layout "u*5|u*4|u*4" --stage-dp 1,1,2 --batch 8 --microbatches 4)
  # Bad input: a clear message naming the value (the command exits non-zero).
  add_test(NAME pipeline.utrans.bad_tp
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:xmesh-train> utransformer --stages 1 --stage-tp 2 --batch 4
            --steps 1 ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.utrans.bad_tp PROPERTIES LABELS "pipeline;mpi" TIMEOUT 30
    ENVIRONMENT "${XMP_UT_ENV}" PASS_REGULAR_EXPRESSION "tensor parallel degree 2")
  add_test(NAME pipeline.utrans.bad_groups
    COMMAND xmesh-train utransformer --serial --base-channels 6 --groups 4)
  set_tests_properties(pipeline.utrans.bad_groups PROPERTIES LABELS "pipeline;unit" TIMEOUT 30
    PASS_REGULAR_EXPRESSION "groups 4: must divide the base channels 6")
endif()
