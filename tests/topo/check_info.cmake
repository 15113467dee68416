# cmake -P script: runs xmesh-info on a topology fixture and checks both its
# exit status (PASS_REGULAR_EXPRESSION alone would ignore it) and its output.
#   -DINFO=path/to/xmesh-info -DXML=fixture.xml
execute_process(COMMAND ${INFO} --topo ${XML} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "xmesh-info exited with ${rc}, want 0")
endif()
# the training stack's rows too (read through xmesh_param_get)
foreach(re "xmesh [0-9]+\\.[0-9]+\\.[0-9]+" "XMESH_CHUNK_BYTES +bytes +0"
           "XMP_OVERLAP +string +none" "XMESH_KEEP_FREED +string +1 " "XMESH_CKPT_CRASH +string"
           "8 GPUs, 4 NICs" "4 NIC\\(s\\) per host" "gpu 7 sends through nic 3 \\(eth3\\)")
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "xmesh-info output lacks /${re}/")
  endif()
endforeach()
# A topology that cannot be loaded must make it fail.
execute_process(COMMAND ${INFO} --topo ${XML}.missing RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "xmesh-info exited 0 on a missing topology file:\n${out}${err}")
endif()
message("topo.xmesh_info: exit status 0 and every expected line; a missing file fails (${rc})")
