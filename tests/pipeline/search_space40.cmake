# The search validation's space generated from the model (issue 40 item 1): a dry run of
# microbench/search/validate.py --list for 6, 4 and 8 layers, checked (no MPI, no build).
find_program(XMP_SPACE_PYTHON3 python3)
if(XMP_SPACE_PYTHON3)
  add_test(NAME pipeline.search.validate_space
           COMMAND ${XMP_SPACE_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_search_space.py
                   ${PROJECT_SOURCE_DIR})
  set_tests_properties(pipeline.search.validate_space PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
endif()
# microbench/search/rescore.py (issue 40 item 2): a run still going re-assembled from its
# runs/, tc sizes and the cluster file copy with the NIC burst (no MPI, no trainer).
if(XMP_SPACE_PYTHON3)
  add_test(NAME pipeline.search.rescore
           COMMAND ${XMP_SPACE_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_search_rescore.py
                   ${PROJECT_SOURCE_DIR})
  set_tests_properties(pipeline.search.rescore PROPERTIES LABELS "pipeline;unit" TIMEOUT 60)
endif()
