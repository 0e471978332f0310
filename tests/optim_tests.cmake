# Optimizer tests (issue 4). Each runs in a few seconds.
shardgan_test(test_optim_kernel)
shardgan_mpi_test(test_optim_kernel 120 1)

shardgan_test(test_optim_parity)
shardgan_mpi_test(test_optim_parity 120 1 2 3)

shardgan_test(test_optim_collectives)
shardgan_mpi_test(test_optim_collectives 120 1 2 3 4)
