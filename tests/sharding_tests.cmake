# Sharding engine (issue 3): parity matrix, determinism, traffic and memory formulas.
shardgan_test(test_sharding_matrix)
shardgan_mpi_filtered(test_sharding_matrix test_sharding_matrix "-ReduceDtype16*" 300 1 2 3 4)
# 16-bit reduce_dtype rows (bfloat16, float16) and the float16 average whose sum overflows.
shardgan_mpi_filtered(reduce_dtype_16bit test_sharding_matrix "ReduceDtype16*" 300 2 4)

# Multi-input units, execution-order prefetch, frozen release, ownership, deferred init.
shardgan_test(test_units)
shardgan_mpi_test(test_units 120 1 2 3)

# BigGAN at stage 3 on 2 and 3 ranks equals stage 0 on one rank (ctest -R biggan).
shardgan_test(test_biggan_parity)
shardgan_mpi_test(test_biggan_parity 300 2 3)

# BigGAN end to end: pre-flight, resume (same N bit for bit, 2 -> 3), verify, h5py, sample.
add_test(NAME biggan_train_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/biggan_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(biggan_train_test PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# Independent references (issue 10): SyncBatchNorm against at::batch_norm on the global
# batch plus a float64 gradient check (ctest -R syncbn_ref).
shardgan_test(test_syncbn_ref)
shardgan_mpi_test(test_syncbn_ref 60 1 2 3)

# Stage-3 gradients against plain LibTorch autograd on torch::nn modules (ctest -R grad_ref).
shardgan_test(test_grad_ref)
shardgan_mpi_test(test_grad_ref 60 1 2 3)

# R1 penalty (double backward) through a stage-3 D: parity with stage 0 on one rank and
# with plain autograd (ctest -R r1).
shardgan_test(test_r1)
shardgan_mpi_test(test_r1 60 1 2 3)

# Hardening II (issue 22): a unit without gradients on some ranks still reduces, in the
# shared order (ctest -R reduce_always); frozen elements inside a flat parameter keep value
# and state under every optimizer (ctest -R frozen_mask).
shardgan_test(test_hardening)
shardgan_mpi_filtered(reduce_always test_hardening "Stages/RankBranch.*" 120 1 2 3)
shardgan_mpi_filtered(frozen_mask test_hardening "Stages/FrozenMask.*" 120 1 2 3)
shardgan_mpi_filtered(preempt_grace_rule test_hardening "PreemptGrace.*" 60 1)
shardgan_mpi_filtered(lifetime test_hardening "Lifetime.*" 60 1)

# Hybrid sharding (issue 23): R replica groups, sharded inside and replicated across, equal
# stage 0 on one rank; checkpoints move between R and N; groups follow the nodes (ctest -R hsdp).
shardgan_test(test_hsdp)
shardgan_mpi_test(test_hsdp 300 2 4)
# The layout case needs an even world size: not part of the 3-rank entry.
shardgan_mpi_filtered(test_hsdp test_hsdp "-HsdpLayoutTest.GroupsFollowNodesAndRefuseBadDegrees" 300 3)

# HSDP checkpoints resumed at another world size and replica degree (issue 23).
add_test(NAME hsdp_resume_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hsdp_resume_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(hsdp_resume_test PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# Activation checkpointing (issue 21): training steps with it on equal them with it off,
# bit for bit: BigGAN (SN, SyncBN, attention, frozen D, R1) and DCGAN at stages 0, 2, 3
# (ctest -R activation_checkpointing).
shardgan_test(test_activation_checkpointing)
shardgan_mpi_test(test_activation_checkpointing 300 1 2)

# train.d_joint_pass: one D pass on cat([fake, real]) equals the separate passes (float64,
# SGD) and halves D's collectives; R1 updates keep the separate passes.
shardgan_test(test_d_joint_pass)
shardgan_mpi_test(test_d_joint_pass 300 1 2)

# The node-shared stage-3 gather (sharding.<model>.node_shared_gather): the same bits as the
# MPI all-gather with no MPI all-gather, page lifetime, and the timeout naming a silent rank.
shardgan_test(test_node_shared_gather)
shardgan_mpi_test(test_node_shared_gather 120 2 3)

# train.update: simultaneous (ParaGAN) against a plain-autograd reference of its equations.
shardgan_test(test_simultaneous_update)
shardgan_mpi_filtered(simultaneous_update test_simultaneous_update "*" 300 1 2 4)
# train.aux_class_weight (AC-GAN) against a plain-autograd reference of its losses, on every
# path of the objective that computes one of them.
shardgan_test(test_aux_class)
shardgan_mpi_filtered(aux_class test_aux_class "*" 300 1 2 4)
add_test(NAME simultaneous_update_train
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/simultaneous_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(simultaneous_update_train PROPERTIES TIMEOUT 900 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# train.placement: split (ParaGAN's G and D rank groups): parity with shared in float64 for
# both update rules, bytes between the groups, cross-placement resume, refusals.
add_test(NAME split_placement
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/split_placement_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(split_placement PROPERTIES TIMEOUT 1200 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# ZeRO++ hpZ (sharding.<model>.hpz_partition_size): the same bits as the world gather, plain
# and with qwZ, with only each unit's first gather after an update over the world; the
# secondary blocks against the memory estimate; stale blocks without after_optimizer_step.
shardgan_test(test_hpz)
shardgan_mpi_filtered(hpz test_hpz "*" 120 2 4)
add_test(NAME hpz_train
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hpz_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(hpz_train PROPERTIES TIMEOUT 900 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# The offload layer's workers (issue 58): TierWorker (gradient writes) and ReadAhead (one
# long-lived parameter read-ahead thread per model): FIFO, one thread, the tier mutex, the
# bounded queue, errors, drain and destruction with work queued. The control makes
# ReadAhead start one std::async thread per read, as before; its single-thread case must fail.
shardgan_test(test_tier_worker)
shardgan_mpi_test(test_tier_worker 60 1)
add_test(NAME tier_worker_control
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 --oversubscribe $<TARGET_FILE:test_tier_worker>
                 --gtest_filter=ReadAhead.ReadsRunOnTheOneWorkerThread)
set_tests_properties(tier_worker_control PROPERTIES TIMEOUT 60 WILL_FAIL TRUE
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=read_ahead_async")
