# Overlap switches for the U-Transformer (issue 20 items 4 and 7): the convolution forms of the
# nn/overlap.h building blocks against the blocking path, every element (the .break case corrupts
# one result on purpose and must fail); xmesh-train utransformer with every switch on, with each
# alone and with none, per-step losses equal within 1e-6 relative and each run against the serial
# reference within 1e-5 over 5 steps (--check-serial; the .break case perturbs one loss and must
# fail). Pass = exit status 0 of the test program / script.
set(XMP_UTOV_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
add_executable(test_overlap_conv ${CMAKE_CURRENT_LIST_DIR}/test_overlap_conv.c)
target_link_libraries(test_overlap_conv PRIVATE xmesh_pipeline m)
foreach(np 1 4 8)
  add_test(NAME pipeline.utov.conv.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_overlap_conv> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.utov.conv.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
    ENVIRONMENT "${XMP_UTOV_ENV}")
endforeach()
add_test(NAME pipeline.utov.conv.break
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
          ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_overlap_conv> --break ${MPIEXEC_POSTFLAGS})
set_tests_properties(pipeline.utov.conv.break PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
  WILL_FAIL TRUE ENVIRONMENT "${XMP_UTOV_ENV}")

if(TARGET xmesh-train)
  set(XMP_UTOV_PY ${CMAKE_CURRENT_LIST_DIR}/test_overlap_utrans.py)
  foreach(c megatron.2x2 megatron.1x4 3d.2x2x2 axonn.2x2x2 dp.zero.2x2 pipe.axonn-dp.delay)
    add_test(NAME pipeline.utov.${c}
      COMMAND python3 ${XMP_UTOV_PY} ${c} $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    # about 2-10 s each on an idle host; the limit leaves room for a loaded one
    set_tests_properties(pipeline.utov.${c} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
      ENVIRONMENT "${XMP_UTOV_ENV}")
  endforeach()
  add_test(NAME pipeline.utov.break
    COMMAND python3 ${XMP_UTOV_PY} megatron.2x2 $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE}
            --break)
  set_tests_properties(pipeline.utov.break PROPERTIES LABELS "pipeline;mpi" TIMEOUT 120
    WILL_FAIL TRUE ENVIRONMENT "${XMP_UTOV_ENV}")
endif()

# A bad switch name is refused by the shared trainer parser (both models), naming the token:
# pass = a clean non-zero exit AND the message (test_utrans_expect_fail.sh).
if(TARGET xmesh-train)
  foreach(m utransformer gpt)
    add_test(NAME pipeline.utov.bad_switch.${m}
      COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_utrans_expect_fail.sh
              "--overlap: overlap 'bwd-input,prefech': unknown switch 'prefech'"
              $<TARGET_FILE:xmesh-train> ${m} --serial --overlap bwd-input,prefech)
    set_tests_properties(pipeline.utov.bad_switch.${m} PROPERTIES LABELS "pipeline;unit" TIMEOUT 30)
  endforeach()
endif()
