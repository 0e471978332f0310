# Fuzzers (issue 10): included by tests/CMakeLists.txt. Select them with `ctest -R fuzz`.
# Both are Python scripts for the project's environment (.venv: h5py, numpy, PyYAML); each prints
# one PASS/FAIL line per case and a summary, and exits 1 on any failure.
#   ckpt_fuzz:   208 seeded corruptions of every HDF5 region of a checkpoint's rank files and
#                index.h5 against `shardgan-ckpt verify`, 52 of them also against --resume
#                (about 2.5 to 3.5 minutes on a busy 2-core machine).
#   config_fuzz: about 126 mutated YAML configs against `shardgan-train --dry-run`
#                (about 1.5 minutes there).
foreach(script ckpt_fuzz config_fuzz)
  add_test(NAME ${script}
           COMMAND ${SHARDGAN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/${script}_test.py $<TARGET_FILE:shardgan-train>
                   $<TARGET_FILE:shardgan-ckpt> ${PROJECT_SOURCE_DIR})
  set_tests_properties(${script} PROPERTIES TIMEOUT 600 ENVIRONMENT "${SHARDGAN_TEST_ENV}" PROCESSORS 2)
endforeach()
