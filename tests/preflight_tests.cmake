# Memory pre-flight estimator: included by tests/CMakeLists.txt.
shardgan_test(test_memory_estimate)
shardgan_mpi_test(test_memory_estimate 120 1 2 3 4)
shardgan_test(test_memory_probe)
shardgan_mpi_test(test_memory_probe 300 1)
# Disk pre-flight: saves counted, this run's offload files credited, refusals naming the keys.
shardgan_test(test_disk_preflight)
shardgan_mpi_filtered(disk_preflight test_disk_preflight "*" 60 1)
# Finding 4's control: a save that does not wait for the last rotation's deletion must be
# caught by DiskPreflight.SaveWaitsForPendingDeletion.
shardgan_mpi_filtered(disk_preflight_deletion_wait_control test_disk_preflight "*SaveWaitsForPendingDeletion" 60 1)
set_tests_properties(disk_preflight_deletion_wait_control_np1 PROPERTIES WILL_FAIL TRUE
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=save_skips_deletion_wait")
# Issue 58, finding 1: the step's phases against a real step's gradient shards and the
# pre-flight's count of them, at 2 and 4 ranks (tests/test_preflight_phases.cpp).
shardgan_test(test_preflight_phases)
add_test(NAME preflight_alive_buffers
         COMMAND bash -c "\"$0\" -np 2 --oversubscribe \"$1\" && \"$0\" -np 4 --oversubscribe \"$1\""
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:test_preflight_phases>)
set_tests_properties(preflight_alive_buffers PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
# The pre-flight's prediction against each rank's VmHWM on a widened conditional BigGAN,
# simultaneous update with the shared D forward, stages 2 and 3, d_steps 2, 2 ranks
# (tests/preflight_vmhwm_test.sh; `... all` adds the 4-rank cells).
add_test(NAME preflight_vmhwm COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/preflight_vmhwm_test.sh
                                      $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(preflight_vmhwm PROPERTIES TIMEOUT 900 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
