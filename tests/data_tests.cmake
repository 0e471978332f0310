# Fashion-MNIST images and labels, synthetic labels, and greyscale/RGB/class PNG grids.
shardgan_test(test_data_grid)
target_compile_definitions(test_data_grid PRIVATE SHARDGAN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# stbi_load for reading grids back: libstb holds the implementation (as it does stbi_write_png's
# for the library), so the test defines no STB_*_IMPLEMENTATION.
target_link_libraries(test_data_grid PRIVATE stb ZLIB::ZLIB)
shardgan_mpi_test(test_data_grid 120 1)
