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

# libFuzzer targets (issue 60): tests/fuzz/<target>_fuzz.cpp, each an
# LLVMFuzzerTestOneInput over one reader of user input; seed corpora and every finding in
# tests/fuzz/corpus/<target>/. scripts/fuzz.sh builds them with clang and libFuzzer
# (tests/fuzz/fuzz_targets.cmake) and fuzzes one. Here the same entry points are built with
# this compiler and tests/fuzz/driver_main.cpp, a plain main that replays a corpus, so that
# ctest needs no second compiler (SHARDGAN_FUZZ_REPLAY: the checkpoint targets then run
# `verify` itself, whose forked child must turn an input on which Debian's HDF5 crashes into
# a reported problem). Corpus files: seed-* (real files the project wrote, which the reader
# must accept) and finding-* (each input a fuzzing run failed on, kept after its fix):
#   fuzz_regression: every corpus entry of every target; each target's seeds must still
#                    be accepted by its reader (--min-accepted), so a harness that no
#                    longer reaches the reader fails (a few seconds).
#   fuzz_regression_control: the driver under test_control fuzz_planted_crash on a folder
#                    holding an input that starts with "PLANTED": the planted crash must
#                    fail the replay (WILL_FAIL).
set(SHARDGAN_FUZZ_TARGETS config ckpt_index ckpt_rankfile hdf5_dataset paired_folder classifier)
# The targets whose harness reaches a torch header load the precompiled one; the two
# checkpoint harnesses (HDF5 and the manifest only) compile without it, which spares two
# loads of the ~700 MB header on the 2-core machines.
set(SHARDGAN_FUZZ_TORCH_TARGETS config hdf5_dataset paired_folder classifier)
set(shardgan_fuzz_replay_args)
# The replay driver (no torch) is compiled once for all of them.
add_library(fuzz_replay_driver OBJECT fuzz/driver_main.cpp)
target_link_libraries(fuzz_replay_driver PRIVATE shardgan)
target_include_directories(fuzz_replay_driver PRIVATE ${PROJECT_SOURCE_DIR}/src ${HDF5_INCLUDE_DIRS})
target_compile_definitions(fuzz_replay_driver PRIVATE SHARDGAN_FUZZ_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/fuzz/data"
                           SHARDGAN_FUZZ_REPLAY=1)
target_compile_options(fuzz_replay_driver PRIVATE -Wall -Wextra -Wno-unused-parameter)
foreach(t ${SHARDGAN_FUZZ_TARGETS})
  add_executable(fuzz_replay_${t} fuzz/${t}_fuzz.cpp $<TARGET_OBJECTS:fuzz_replay_driver>)
  target_link_libraries(fuzz_replay_${t} PRIVATE shardgan ${HDF5_C_LIBRARIES})
  target_include_directories(fuzz_replay_${t} PRIVATE ${PROJECT_SOURCE_DIR}/src ${HDF5_INCLUDE_DIRS})
  target_compile_definitions(fuzz_replay_${t} PRIVATE SHARDGAN_FUZZ_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/fuzz/data"
                             SHARDGAN_FUZZ_REPLAY=1)
  target_compile_options(fuzz_replay_${t} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(t IN_LIST SHARDGAN_FUZZ_TORCH_TARGETS)
    target_precompile_headers(fuzz_replay_${t} REUSE_FROM shardgan)
  endif()
  list(APPEND shardgan_fuzz_replay_args $<TARGET_FILE:fuzz_replay_${t}> ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${t})
endforeach()
add_test(NAME fuzz_regression
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/replay_all.sh ${shardgan_fuzz_replay_args})
add_test(NAME fuzz_regression_control
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/replay_all.sh $<TARGET_FILE:fuzz_replay_config>
                 ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/control)
# SHARDGAN_HDF5_PROBE_DEADLINE_S: the finding-hdf5-spin-* entries make libhdf5 spin for
# minutes; the probe (include/shardgan/h5/probe.h) ends each after 3 s instead of 120.
set_tests_properties(fuzz_regression fuzz_regression_control PROPERTIES TIMEOUT 120
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_HDF5_PROBE_DEADLINE_S=3")
set_tests_properties(fuzz_regression_control PROPERTIES WILL_FAIL TRUE
                     ENVIRONMENT "${SHARDGAN_TEST_ENV};SHARDGAN_TEST_CONTROL=fuzz_planted_crash")
