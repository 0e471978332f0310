# The training step: typed step statistics, the split placement's declarative schedule,
# and the golden runs of the step's combinations. Included by tests/CMakeLists.txt.
shardgan_test(test_step_stats)
shardgan_mpi_test(test_step_stats 60 1)
shardgan_test(test_step_schedule)

# ctest names the issue asks for: step_stats and step_schedule run the two at 3 ranks.
add_test(NAME step_stats COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe
                                 $<TARGET_FILE:test_step_stats>)
add_test(NAME step_schedule COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe
                                    $<TARGET_FILE:test_step_schedule>)
set_tests_properties(step_stats step_schedule PROPERTIES TIMEOUT 60 ENVIRONMENT "${SHARDGAN_TEST_ENV}"
                     PROCESSORS 2)
# The schedule check in a real split run: with the test-only control split_schedule_reorder
# D's ranks declare a reordered schedule, and every rank must end naming the schedule.
add_test(NAME step_schedule_control
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/step_schedule_control.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(step_schedule_control PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
# Golden runs: every cell of tests/golden/cells.sh against its stage-0 one-rank float64
# counterpart within 1e-9; the control runs the references with another seed and must fail.
add_test(NAME golden_runs COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/golden/golden_runs_test.sh
                                  $<TARGET_FILE:shardgan-train> $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
add_test(NAME golden_runs_control COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/golden/golden_runs_test.sh
                                          $<TARGET_FILE:shardgan-train> $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(golden_runs PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
set_tests_properties(golden_runs_control PROPERTIES TIMEOUT 120 PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=golden_perturb")
# A non-finite G loss under split placement skips G's update as under shared (D's verdict
# travels with the gradients); the control drops the verdict and must make split differ.
add_test(NAME split_nonfinite COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/split_nonfinite_test.sh
                                      $<TARGET_FILE:shardgan-train> $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR} 0)
add_test(NAME split_nonfinite_control COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/split_nonfinite_test.sh
                                              $<TARGET_FILE:shardgan-train> $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR} 1)
set_tests_properties(split_nonfinite split_nonfinite_control PROPERTIES TIMEOUT 180
                     ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
# Split placement: D's ranks wait through G's sample grids and evaluations explicitly
# (eval.timeout_s); the control with eval.timeout_s 0 must end the job naming the key.
add_test(NAME split_eval_wait COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/split_eval_wait_test.sh
                                      $<TARGET_FILE:shardgan-train> $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(split_eval_wait PROPERTIES TIMEOUT 240 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
# MPI errors that speak: a truncated receive is a CollectiveError naming the call, the
# communicator, the peer and the MPI error; split placement with mismatched image shapes ends
# every rank naming both shapes before any transfer. The control keeps MPI's fatal handler:
# the truncated receive must then abort.
shardgan_test(test_mpi_errors)
add_test(NAME mpi_errors COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_errors_test.sh $<TARGET_FILE:test_mpi_errors>
                                 $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(mpi_errors PROPERTIES TIMEOUT 180 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
shardgan_mpi_filtered(mpi_errors_control test_mpi_errors "MpiErrors.Truncated*" 60 2)
set_tests_properties(mpi_errors_control_np2 PROPERTIES WILL_FAIL TRUE
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=mpi_errors_fatal")
