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

# The chaos campaign's smoke subset (benchmarks/chaos.sh): 12 trials of a fixed seed, one per
# fault kind (--stratify), each in a random cell of 12 of the campaign's cheaper ones (DCGAN
# and pix2pix on 2-4 ranks, BigGAN split on 3): every rank exits within 60 s naming
# the cause, every committed checkpoint verifies, --resume auto picks the newest and
# completes, and deterministic cells end bit for bit on the uninterrupted run. Needs root for
# the full-disk (tmpfs) and link-cut (ip netns) trials; without root those are not drawn.
add_test(NAME chaos_smoke
         COMMAND bash ${PROJECT_SOURCE_DIR}/benchmarks/chaos.sh --seed 2026 --trials 12 --stratify
                 --cells dcgan-s0,dcgan-s3,dcgan-s2-np3,dcgan-s3-sim,dcgan-async-fork,dcgan-async-copy,dcgan-offload-param,dcgan-offload-grad,dcgan-hsdp,dcgan-2hosts-hsdp,pix2pix-s3,biggan-split
                 --train $<TARGET_FILE:shardgan-train> --ckpt $<TARGET_FILE:shardgan-ckpt>
                 --work ${CMAKE_CURRENT_BINARY_DIR}/chaos_smoke --out ${CMAKE_CURRENT_BINARY_DIR}/chaos_smoke/trials.jsonl
                 --fresh)
set_tests_properties(chaos_smoke PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
# Its negative control: resumed runs take the latents from start-up instead of the
# checkpoint (test-only switch resume_skips_noise_rng). The trial's fault is fixed: rank 1's
# third fsync (its rank file of step 6) fails, so steps 2 and 4 are committed and the resume
# starts at 4; it must end off the uninterrupted run, with every other check passing
# (--expect-divergence).
add_test(NAME chaos_smoke_control
         COMMAND bash ${PROJECT_SOURCE_DIR}/benchmarks/chaos.sh --seed 2026 --trials 1 --cells dcgan-s3
                 --fault fsync_eio --victim 1 --k 2 --train $<TARGET_FILE:shardgan-train> --ckpt $<TARGET_FILE:shardgan-ckpt>
                 --work ${CMAKE_CURRENT_BINARY_DIR}/chaos_smoke_control --out ${CMAKE_CURRENT_BINARY_DIR}/chaos_smoke_control/trials.jsonl
                 --fresh --expect-divergence)
set_tests_properties(chaos_smoke_control PROPERTIES TIMEOUT 300
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=resume_skips_noise_rng" PROCESSORS 2)
