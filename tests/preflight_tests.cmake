# Memory pre-flight estimator: included by tests/CMakeLists.txt.
shardgan_test(test_memory_estimate)
shardgan_mpi_test(test_memory_estimate 120 1 2 3 4)
shardgan_test(test_memory_probe)
target_compile_definitions(test_memory_probe PRIVATE SHARDGAN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
shardgan_mpi_test(test_memory_probe 300 1)
# Disk pre-flight: saves counted, this run's offload files credited, refusals naming the keys.
shardgan_test(test_disk_preflight)
shardgan_mpi_filtered(disk_preflight test_disk_preflight "*" 60 1)
