# The user documentation checked against the code (tests/docs_test.sh): the generated config
# reference, --print-config round trips, no diary words or notebook phrases in the user pages
# (docs/ recursively, less docs/history/) or in the comments of examples/, scripts/, configs/
# and benchmarks/, no dated headings, no broken links or paths, and the GPU status line on
# the four GPU pages.
add_test(NAME config_reference
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs_test.sh $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(config_reference PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}")
# Its negative control: the page checks read a copy of the tree with one planted defect per
# check ("issue 12" in docs/dev/, "used to", a dated heading, a broken link and path, the
# status line removed); the script fails, as expected, only if each is reported by its own
# check and a planted diary word in docs/history/ is not.
add_test(NAME config_reference_control
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs_test.sh $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(config_reference_control PROPERTIES TIMEOUT 60 WILL_FAIL TRUE
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=docs_planted")

# The checkpoint comparisons' own negative controls (tests/lib_selftest.sh): same_checkpoint,
# checkpoints_within and ckpt_close.py fail on a missing checkpoint, a rank file only in B
# and NaN, and pass an equal pair, on tiny fake checkpoints written with h5py.
add_test(NAME test_lib_selftest COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/lib_selftest.sh)
set_tests_properties(test_lib_selftest PROPERTIES TIMEOUT 60 ENVIRONMENT "${SHARDGAN_TEST_ENV}")

# The source tree's structure (tests/structure_test.py): no file under src/ over 600 lines,
# no include of a higher layer (docs/design.md, "Layers"). structure_control is its negative
# control: --self-test exits 0 only if the check reports both kinds of finding in a
# synthetic tree.
add_test(NAME structure COMMAND ${SHARDGAN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/structure_test.py ${PROJECT_SOURCE_DIR})
add_test(NAME structure_control COMMAND ${SHARDGAN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/structure_test.py --self-test)
set_tests_properties(structure structure_control PROPERTIES TIMEOUT 30)
