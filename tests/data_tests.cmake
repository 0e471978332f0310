# Fashion-MNIST images and labels, synthetic labels, and greyscale/RGB/class PNG grids.
shardgan_test(test_data_grid)
# stbi_load for reading grids back: libstb holds the implementation (as it does stbi_write_png's
# for the library), so the test defines no STB_*_IMPLEMENTATION; shardgan_tests links it.
shardgan_mpi_test(test_data_grid 120 1)
# Control: the whole-split float copy the loader no longer makes must break the decode peak check.
# Not in a sanitizer build (scripts/sanitize.sh), where the peak is not checked.
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
  shardgan_mpi_filtered(fmnist_decode_peak_control test_data_grid "FashionMnistImages.DecodePeak*" 60 1)
  set_tests_properties(fmnist_decode_peak_control_np1 PROPERTIES WILL_FAIL TRUE
                       ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=fmnist_decode_whole")
endif()

# data.source hdf5: reader, converters, validation errors, prefetcher, loader schedule.
shardgan_test(test_hdf5_data)
shardgan_mpi_test(test_hdf5_data 300 1 2 3)
# Training from a converted HDF5 file == from the idx files; resume; errors on every rank.
add_test(NAME hdf5_train_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hdf5_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE_DIR:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(hdf5_train_test PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)

# Real colour images: scripts/emoji-data.sh (Noto Color Emoji's bitmaps, composited over white,
# padded to squares, converted at 32 and 64) on its first 500 glyphs, and 2 training steps on
# them. The control drops the alpha channel instead of compositing: the white-pixel check
# must fail. Both skip (77) without the font or fontTools (scripts/setup.sh installs them).
add_test(NAME emoji_data
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/emoji_data_test.sh $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
add_test(NAME emoji_data_control
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/emoji_data_test.sh $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(emoji_data emoji_data_control PROPERTIES TIMEOUT 300 PROCESSORS 2 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${SHARDGAN_TEST_ENV}")
set_tests_properties(emoji_data_control PROPERTIES WILL_FAIL TRUE
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=emoji_no_composite")
