# Several hosts on one machine (issue 23; ctest -R multihost): network namespaces, 2 ranks
# per namespace, Open MPI's TCP transport only. Needs root for ip netns.
add_test(NAME multihost_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/multihost_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(multihost_test PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
