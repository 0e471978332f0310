# The user documentation checked against the code (tests/docs_test.sh): the generated config
# reference, --print-config round trips, no diary words, no broken relative links.
add_test(NAME config_reference
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs_test.sh $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(config_reference PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}")
