# Sharding engine (issue 3): parity matrix, determinism, traffic and memory formulas.
shardgan_test(test_sharding_matrix)
shardgan_mpi_test(test_sharding_matrix 300 1 2 3 4)
