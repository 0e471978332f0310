# Failures end cleanly (issue 10): preemption signals and --resume auto, kill -9 of a rank,
# an exception on one rank, NaN/Inf skip and abort; on 2 and 3 ranks.
foreach(np 2 3)
  add_test(NAME fault_test_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fault_test.sh $<TARGET_FILE:shardgan-train>
                   $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR} ${np})
  set_tests_properties(fault_test_np${np} PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
endforeach()

# Preemption within train.preempt_grace_s (issue 22; ctest -R preempt_grace).
add_test(NAME preempt_grace_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/preempt_grace_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(preempt_grace_test PROPERTIES TIMEOUT 900 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
