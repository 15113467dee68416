# Boundary dtype (issue 22 item 5; driver.h "Boundary dtype", docs/DTYPES.md): toy stages on
# 2 and 4 ranks whose received activations and gradients must equal, element for element, the
# producer's f32 values rounded to bf16 / f16 by a reference conversion (unchanged without the
# option), with the driver's boundary bytes halved; XMESH_HOST_ID=rank/1 puts every rank on its
# own host so the cross-host bytes are nonzero and are checked to halve too.
add_executable(test_pipeline_driver_bdtype ${CMAKE_CURRENT_LIST_DIR}/test_driver_bdtype.c)
target_link_libraries(test_pipeline_driver_bdtype PRIVATE xmesh_pipeline)
set(XMP_BD_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;XMESH_HOST_ID=rank/1")
foreach(np 2 4)
  add_test(NAME pipeline.driver.bdtype.n${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_pipeline_driver_bdtype> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(pipeline.driver.bdtype.n${np} PROPERTIES LABELS "pipeline;mpi" TIMEOUT 60
    ENVIRONMENT "${XMP_BD_ENV}")
endforeach()
# xmesh-train --boundary-dtype on 2 stages of both models against the f32 run
# (test_bdtype_train.py: exit status, losses within 1e-2 relative and not all equal, boundary
# bytes in the JSON summary halved), and the flag's refusals.
if(TARGET xmesh-train)
  foreach(case "gpt;bf16" "ut;bf16" "gpt;f16")
    list(GET case 0 model)
    list(GET case 1 dt)
    add_test(NAME pipeline.trainer.bdtype.${model}_${dt}
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/test_bdtype_train.py ${model} ${dt}
                     $<TARGET_FILE:xmesh-train> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(pipeline.trainer.bdtype.${model}_${dt} PROPERTIES LABELS "pipeline;mpi"
                         TIMEOUT 120)
  endforeach()
  foreach(c
      "bad|--boundary-dtype 'i32': expected f32, bf16 or f16|gpt;--serial;--boundary-dtype;i32"
      "serial|--boundary-dtype bf16: --serial has no stage boundaries|gpt;--serial;--boundary-dtype;bf16"
      "check_serial|--boundary-dtype f16 rounds the boundaries|gpt;--stages;2;--check-serial;--boundary-dtype;f16")
    string(REPLACE "|" ";" parts "${c}")
    list(GET parts 0 name)
    list(GET parts 1 want)
    list(SUBLIST parts 2 -1 args)
    add_test(NAME pipeline.trainer.bdtype.refused_${name}
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/test_utrans_expect_fail.sh "${want}"
                     $<TARGET_FILE:xmesh-train> ${args})
    set_tests_properties(pipeline.trainer.bdtype.refused_${name} PROPERTIES
                         LABELS "pipeline;unit" TIMEOUT 30)
  endforeach()
endif()
