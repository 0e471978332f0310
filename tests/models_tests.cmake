# Model families (BigGAN layers and models): included by tests/CMakeLists.txt.
shardgan_test(test_biggan_layers)
shardgan_mpi_test(test_biggan_layers 120 1 2)

shardgan_test(test_biggan_model)
shardgan_mpi_test(test_biggan_model 180 1 2)
