# Model families (BigGAN layers and models): included by tests/CMakeLists.txt.
shardgan_test(test_biggan_layers)
shardgan_mpi_test(test_biggan_layers 120 1 2)

shardgan_test(test_biggan_model)
shardgan_mpi_test(test_biggan_model 180 1 2)

# pix2pix: the U-Net's skips across sharding units (parity against a plain-autograd U-Net and
# stage 0 on one rank), their lifetime under activation checkpointing, and PSNR/SSIM
# against scikit-image.
shardgan_test(test_pix2pix)
shardgan_mpi_filtered(pix2pix_parity test_pix2pix "Pix2PixParity.*:Pix2PixModel.*" 600 1 2 4)
shardgan_mpi_filtered(pix2pix_skip_lifetime test_pix2pix "Pix2PixSkipLifetime.*" 120 1 2)
add_test(NAME image_quality
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/image_quality_test.sh $<TARGET_FILE:test_pix2pix>
                 ${CMAKE_CURRENT_SOURCE_DIR}/image_quality_check.py)
set_tests_properties(image_quality PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}" SKIP_RETURN_CODE 77)
add_test(NAME pix2pix_train
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/pix2pix_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR} $<TARGET_FILE:shardgan-data>
                 ${CMAKE_BINARY_DIR}/fid/fmnist-classifier.h5)
# The classifier (eval_tests.cmake's fid_classifier fixture) lets it check pix2pix's eval_set tag.
set_tests_properties(pix2pix_train PROPERTIES TIMEOUT 900 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2
                     FIXTURES_REQUIRED fid_classifier)

# DCGAN at 32 to 256 pixels: the paper's 64x64 layout (parameter counts against a re-typed
# plain-PyTorch copy, tests/dcgan_reference.py), shapes at every size, refused sizes.
shardgan_test(test_dcgan_resolution)
add_test(NAME dcgan_resolution COMMAND test_dcgan_resolution)
set_tests_properties(dcgan_resolution PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}")
# The BigGAN presets at 64 and 128 (configs/biggan-64.yaml, biggan-128.yaml) on a converted
# folder, 2 steps each at a narrow width.
add_test(NAME biggan_presets
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/biggan_presets_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-data> ${PROJECT_SOURCE_DIR})
set_tests_properties(biggan_presets PROPERTIES TIMEOUT 300 PROCESSORS 2 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")
# StyleGAN2: the presets' parameter counts and every parameter's name and shape against our
# plain-PyTorch peer (benchmarks/peers/stylegan2.py, on the meta device; skips without the
# Python), shapes and a backward at float64, the per-sample noise seeds, style mixing,
# w_avg, the layers' double backward, and config errors naming their keys.
shardgan_test(test_stylegan2_model)
add_test(NAME stylegan2_model COMMAND test_stylegan2_model)
set_tests_properties(stylegan2_model PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}")
# StyleGAN2's recipe under ZeRO in float64 (separate lazy R1 and path-length updates, style
# mixing, Adam with the lazy correction): stages 0-3 with and without activation
# checkpointing on 1, 2 and 4 ranks equal stage 0 on one rank; the negative control keeps a
# running path-length mean per rank (as the authors' code), which must break that parity.
shardgan_test(test_stylegan2_parity)
shardgan_mpi_filtered(stylegan2_parity test_stylegan2_parity "Stylegan2Parity.*" 300 1)
shardgan_mpi_filtered(stylegan2_parity test_stylegan2_parity "Stylegan2Parity.ShardedEqualsOneRankStage0" 300 2 4)
add_test(NAME stylegan2_parity_control_np2
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                 $<TARGET_FILE:test_stylegan2_parity> --gtest_filter=Stylegan2Parity.ShardedEqualsOneRankStage0)
set_tests_properties(stylegan2_parity_control_np2 PROPERTIES TIMEOUT 300 PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=pl_mean_per_rank")
# The same recipe on one rank against an independent plain-autograd reference
# (tests/stylegan2_plain_reference.h, which tests/test_stylegan2_reference.cpp holds to the
# family's forwards and gradients); its control drops R1's lazy factor, which must fail.
add_test(NAME stylegan2_parity_reference_control
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 --oversubscribe
                 $<TARGET_FILE:test_stylegan2_parity> --gtest_filter=Stylegan2Parity.PlainAutogradReferenceAgrees)
set_tests_properties(stylegan2_parity_reference_control PROPERTIES TIMEOUT 300
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=r1_without_lazy_gain")
shardgan_test(test_stylegan2_reference)
add_test(NAME stylegan2_reference COMMAND test_stylegan2_reference)
set_tests_properties(stylegan2_reference PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}")
# ADA (tests/test_ada.cpp): every transform of the bgc pipe against the authors' matrices and
# an explicit dense resampling in float64 (images, gradient, R1's second derivative), p's
# heuristic and its resume; then a tiny StyleGAN2 with ADA at ZeRO-3 on 1 and 2 ranks against
# stage 0 on one rank, p the same on every rank, every D input augmented. The control takes
# each rank's draws from the first rows of the batch's, which must break that parity.
shardgan_test(test_ada)
add_test(NAME ada COMMAND test_ada)
set_tests_properties(ada PROPERTIES TIMEOUT 120 ENVIRONMENT "${SHARDGAN_TEST_ENV}")
shardgan_mpi_filtered(ada test_ada "AdaTraining.*" 300 2)
add_test(NAME ada_control_np2
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                 $<TARGET_FILE:test_ada> --gtest_filter=AdaTraining.*)
set_tests_properties(ada_control_np2 PROPERTIES TIMEOUT 300 PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=ada_draws_unsliced")
# StyleGAN2 through shardgan-train: resume bit for bit across the R1 and path-length
# updates, bfloat16, the memory pre-flight against VmHWM where a regularization update is
# the peak, and the refusals.
add_test(NAME stylegan2_train
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/stylegan2_train_test.sh $<TARGET_FILE:shardgan-train> ${PROJECT_SOURCE_DIR})
set_tests_properties(stylegan2_train PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
