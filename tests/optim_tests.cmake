# Optimizer tests (issue 4). Each runs in a few seconds.
shardgan_test(test_optim_kernel)
shardgan_mpi_test(test_optim_kernel 120 1)

shardgan_test(test_optim_parity)
shardgan_mpi_test(test_optim_parity 120 1 2 3)

shardgan_test(test_optim_collectives)
shardgan_mpi_test(test_optim_collectives 120 1 2 3 4)

# Offload tiers (issue 9): the store, OffloadedAdam's parity, RAM bound and errors.
shardgan_test(test_offload)
shardgan_mpi_test(test_offload 300 1)
shardgan_test(test_offload_store)
shardgan_mpi_test(test_offload_store 120 1)
add_test(NAME offload_train_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/offload_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(offload_train_test PROPERTIES TIMEOUT 900 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# The disk tier's I/O under injected faults (issue 22; ctest -R fault_inject).
shardgan_test(test_fault_inject)
add_test(NAME fault_inject_direct_file COMMAND test_fault_inject)
set_tests_properties(fault_inject_direct_file PROPERTIES TIMEOUT 60 ENVIRONMENT "${SHARDGAN_TEST_ENV}")
add_test(NAME fault_inject_train_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fault_inject_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(fault_inject_train_test PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# Gradient offload (offload.<model>.gradient) end to end: bitwise parity with no offload.
add_test(NAME gradient_offload
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gradient_offload_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(gradient_offload PROPERTIES TIMEOUT 900 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# Optimizer states in bfloat16 and block-wise 8-bit: the quantizer against a reference
# written in the test, and the fused kernels on every ISA path. Plain gtest, no MPI.
add_executable(test_optimizer_state_dtype test_optimizer_state_dtype.cpp test_adam8_gan_drift.cpp)
target_link_libraries(test_optimizer_state_dtype PRIVATE shardgan GTest::gtest GTest::gtest_main)
target_compile_options(test_optimizer_state_dtype PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_precompile_headers(test_optimizer_state_dtype REUSE_FROM shardgan)  # the GAN drift test uses torch
add_test(NAME optimizer_state_dtype COMMAND test_optimizer_state_dtype)
set_tests_properties(optimizer_state_dtype PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=2")
add_executable(test_state_layout test_state_layout.cpp)
target_link_libraries(test_state_layout PRIVATE shardgan GTest::gtest GTest::gtest_main)
target_compile_options(test_state_layout PRIVATE -Wall -Wextra -Wno-unused-parameter)
add_test(NAME state_layout COMMAND test_state_layout)
set_tests_properties(state_layout PROPERTIES TIMEOUT 60)

# The same states inside the trainer's sharded optimizer: sharded Adam with bfloat16 or int8
# states at stages 1-3 equals the unsharded step bit for bit (blocks aligned per parameter
# and shard), frozen parameters keep their stored bits, m is not stored with beta1 0, and
# the negative control (int8 blocks not aligned) shows the comparison catches a straddle.
shardgan_test(test_state_dtype_sharded)
shardgan_mpi_filtered(optimizer_state_dtype_sharded test_state_dtype_sharded "StateDtypeSharded.*-StateDtypeSharded.UnalignedControl" 300 1 2 4)
add_test(NAME optimizer_state_dtype_unaligned_control_np2
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe $<TARGET_FILE:test_state_dtype_sharded>
                 --gtest_filter=StateDtypeSharded.UnalignedControl)
set_tests_properties(optimizer_state_dtype_unaligned_control_np2 PROPERTIES TIMEOUT 120 PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=state_dtype_unaligned")
# Reduced states through a checkpoint: bfloat16 resumes bit for bit across stages; float32
# and int8 checkpoints load into each other's flat layouts parameter by parameter.
shardgan_mpi_filtered(state_dtype_checkpoint test_state_dtype_sharded "StateDtypeCheckpoint.*" 300 2)
# Offloaded reduced states and bfloat16 offloaded gradients: equal to resident, resume bit for bit.
shardgan_test(test_state_dtype_offload)
shardgan_mpi_filtered(state_dtype_offload test_state_dtype_offload "StateDtypeOffload.*" 300 1 2)
