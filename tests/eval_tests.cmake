# The quality metric (FID on a Fashion-MNIST classifier's features; docs/fid.md).
# The fixture trains the classifier once (~1.5 min on 2 cores); test_fid (~10 s) reads it.
# OMP_WAIT_POLICY=passive: spinning OpenMP threads slowed training ~2.5x on a loaded machine.
set(SHARDGAN_FID_CLASSIFIER_FILE ${CMAKE_BINARY_DIR}/fid/fmnist-classifier.h5)
add_test(NAME fid_classifier
         COMMAND $<TARGET_FILE:shardgan-fid> train-classifier -o ${SHARDGAN_FID_CLASSIFIER_FILE}
                 --data ${SHARDGAN_FMNIST_DIR} --epochs 3 --seed 1 --threads 2)
set_tests_properties(fid_classifier PROPERTIES TIMEOUT 600 FIXTURES_SETUP fid_classifier PROCESSORS 2
                     ENVIRONMENT "OMP_WAIT_POLICY=passive")

shardgan_test(test_fid)
target_compile_definitions(shardgan_tests PRIVATE SHARDGAN_FID_CLASSIFIER_PATH="${SHARDGAN_FID_CLASSIFIER_FILE}")
shardgan_mpi_test(test_fid 600 1)
set_tests_properties(test_fid_np1 PROPERTIES FIXTURES_REQUIRED fid_classifier
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")

# FID during training (1 and 2 ranks) and `shardgan-ckpt fid` against the trainer's own.
add_test(NAME eval_train_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/eval_train_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR} ${SHARDGAN_FID_CLASSIFIER_FILE})
set_tests_properties(eval_train_test PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED fid_classifier PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")

# docs/metrics.md against the keys runs write (tests/metrics_reference_test.sh): a StyleGAN2
# with R1, path length and ADA, a DCGAN with evaluations; with its controls (a planted key,
# and SHARDGAN_TEST_CONTROL=metrics_unlisted_field, which the writer must refuse).
add_test(NAME metrics_reference
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/metrics_reference_test.sh $<TARGET_FILE:shardgan-train>
                 ${PROJECT_SOURCE_DIR} ${SHARDGAN_FID_CLASSIFIER_FILE})
set_tests_properties(metrics_reference PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED fid_classifier PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")

# KID, improved precision/recall and IS from feature/logit arrays (src/eval/feature_metrics.cpp)
# against an independent float64 numpy computation (tests/feature_metrics_ref.py), within 1e-6
# relative, plus known answers and refusals; skipped (77) without the Python. The control
# computes the biased MMD (diagonals kept): the comparison must fail.
shardgan_test(test_feature_metrics)
add_test(NAME kid_pr_is COMMAND test_feature_metrics)
set_tests_properties(kid_pr_is PROPERTIES TIMEOUT 120
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_NUM_THREADS=2")
add_test(NAME kid_pr_is_control COMMAND test_feature_metrics --gtest_filter=FeatureMetrics.MatchesFloat64Python)
set_tests_properties(kid_pr_is_control PROPERTIES TIMEOUT 120 WILL_FAIL TRUE
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_NUM_THREADS=2;SHARDGAN_TEST_CONTROL=kid_biased")

# A TorchScript feature network: pytorch-fid's Inception-v3 with random weights
# (scripts/export_inception.py, exported once into the build tree), its features against the
# Python module's, the metrics at Inception's widths against float64 numpy, and the refusals
# of bad files. The control skips the input range mapping: the feature comparison must fail.
shardgan_test(test_torchscript_metrics)
target_compile_definitions(shardgan_tests PRIVATE SHARDGAN_INCEPTION_FILE="${CMAKE_BINARY_DIR}/fid/inception-random.pt"
                           SHARDGAN_VGG16_FILE="${CMAKE_BINARY_DIR}/fid/vgg16-random.pt")
add_test(NAME torchscript_metrics COMMAND test_torchscript_metrics --gtest_filter=-TorchScriptMetrics.Vgg16ExportMatchesPython)
set_tests_properties(torchscript_metrics PROPERTIES TIMEOUT 300 PROCESSORS 2 RESOURCE_LOCK inception_export
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_NUM_THREADS=2")
add_test(NAME torchscript_metrics_control COMMAND test_torchscript_metrics
         --gtest_filter=TorchScriptMetrics.FeaturesMatchPython)
set_tests_properties(torchscript_metrics_control PROPERTIES TIMEOUT 300 WILL_FAIL TRUE RESOURCE_LOCK inception_export
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_NUM_THREADS=2;SHARDGAN_TEST_CONTROL=feature_range")
add_test(NAME torchscript_detector_control COMMAND test_torchscript_metrics
         --gtest_filter=TorchScriptMetrics.StyleGan2AdaDetector)
set_tests_properties(torchscript_detector_control PROPERTIES TIMEOUT 300 WILL_FAIL TRUE RESOURCE_LOCK inception_export
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_NUM_THREADS=2;SHARDGAN_TEST_CONTROL=feature_range")

# torchvision's VGG16 up to fc2 (scripts/export_vgg16.py, random weights, 0.5 GB exported once
# into the build tree) against the Python module: extended tier, about a minute.
add_test(NAME vgg16_export COMMAND test_torchscript_metrics --gtest_filter=TorchScriptMetrics.Vgg16ExportMatchesPython)
set_tests_properties(vgg16_export PROPERTIES TIMEOUT 600 PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_NUM_THREADS=2")

# The reference statistics cache: `shardgan-fid stats`, reuse, rewrite, and stale caches refused.
add_test(NAME fid_stats_cache
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fid_stats_cache_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-fid> ${PROJECT_SOURCE_DIR} ${SHARDGAN_FID_CLASSIFIER_FILE})
set_tests_properties(fid_stats_cache PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED fid_classifier PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")

# Precision and recall on a second network (eval.pr_feature_network), a stand-in with NVIDIA's
# vgg16.pt interface; the control keeps them on the main network: the equality must fail.
add_test(NAME pr_network
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/pr_network_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR} ${SHARDGAN_FID_CLASSIFIER_FILE})
set_tests_properties(pr_network PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED fid_classifier PROCESSORS 2 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")
add_test(NAME pr_network_control
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/pr_network_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR} ${SHARDGAN_FID_CLASSIFIER_FILE})
set_tests_properties(pr_network_control PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED fid_classifier PROCESSORS 2
                     WILL_FAIL TRUE ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive;SHARDGAN_TEST_CONTROL=pr_main_features")

# A classifier trained on another labelled dataset (colour shapes, 3x64x64, 4 classes) and
# used by a DCGAN-64's evaluation; the Fashion-MNIST classifier refused on those images.
add_test(NAME classifier_any_dataset
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/classifier_any_dataset_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-fid> $<TARGET_FILE:shardgan-data> ${PROJECT_SOURCE_DIR}
                 ${SHARDGAN_FID_CLASSIFIER_FILE})
set_tests_properties(classifier_any_dataset PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED fid_classifier PROCESSORS 2
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")

# A folder of one's own 64x64 images to metrics (docs/guides/own-dataset.md).
add_test(NAME own_folder_e2e
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/own_folder_e2e_test.sh $<TARGET_FILE:shardgan-train>
                 $<TARGET_FILE:shardgan-ckpt> $<TARGET_FILE:shardgan-fid> $<TARGET_FILE:shardgan-data>
                 ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/fid/inception-random.pt)
set_tests_properties(own_folder_e2e PROPERTIES TIMEOUT 300 PROCESSORS 2 RESOURCE_LOCK inception_export
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};OMP_WAIT_POLICY=passive")
