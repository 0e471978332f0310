# Memory pre-flight estimator: included by tests/CMakeLists.txt.
shardgan_test(test_memory_estimate)
shardgan_mpi_test(test_memory_estimate 120 1 2 3 4)
