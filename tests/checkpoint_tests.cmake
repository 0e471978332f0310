# Checkpoint tests (issue 5): included by tests/CMakeLists.txt.
shardgan_test(test_checkpoint)
target_compile_definitions(test_checkpoint PRIVATE SHARDGAN_SOURCE_DIR="${PROJECT_SOURCE_DIR}" SHARDGAN_PYTHON="${SHARDGAN_PYTHON}")
shardgan_mpi_test(test_checkpoint 300 4)

# Shell tests driving shardgan-train and shardgan-ckpt.
foreach(script ckpt_tool_test ckpt_errors_test ckpt_kill_test)
  add_test(NAME ${script}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/${script}.sh $<TARGET_FILE:shardgan-train>
                   $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
  set_tests_properties(${script} PROPERTIES TIMEOUT 300 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
endforeach()

shardgan_test(test_checkpoint_ranges)
shardgan_mpi_test(test_checkpoint_ranges 120 1)

# A save that fails on one rank only (rank 1 under a file-size limit): all ranks end at once.
add_test(NAME ckpt_save_failure_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_save_failure_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(ckpt_save_failure_test PROPERTIES TIMEOUT 300 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# Background checkpoints (checkpoint.async): bit-exact against synchronous saves, kill -9
# during the background write, SIGTERM with a write in flight, refused configs.
add_test(NAME async_checkpoint
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/async_checkpoint_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(async_checkpoint PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
