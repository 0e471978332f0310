# Slurm (issue 23): a one-node cluster (scripts/slurm-local.sh: slurmctld, slurmd and munged in a
# temp dir, as root) runs srun --mpi=pmix rank detection and examples/slurm/train.sbatch through
# SIGUSR1, scontrol requeue and two restarts, bit for bit equal to an uninterrupted mpirun run
# (ctest -R slurm; about 1.5 minutes on 2 cores). As a user other than root it reports skipped
# with the reason; as root without Slurm or munge installed it fails, naming what is missing;
# SHARDGAN_SKIP_SLURM=1 in the environment skips it.
add_test(NAME slurm_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
set_tests_properties(slurm_test PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
