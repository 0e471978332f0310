# The libFuzzer build of the fuzz targets (tests/fuzz/<target>_fuzz.cpp): included by the
# top-level CMakeLists.txt when SHARDGAN_FUZZ is ON, in a tree configured with clang++
# (scripts/fuzz.sh makes build-fuzz/ that way). Each target `<target>_fuzz` compiles its
# harness and the reader's own sources with -fsanitize=fuzzer-no-link,address,undefined
# (coverage for libFuzzer, ASan and UBSan checks in them), and takes the rest of shardgan
# (models, torch glue, communicators ...) uninstrumented from the gcc-built library of the
# normal build tree (build/libshardgan.a: LibTorch is built against libstdc++, which clang
# uses too). Compiling only the readers keeps a cold build to ~20 translation units instead
# of the library's ~110. HDF5, yaml-cpp and nlohmann-json are Debian's and uninstrumented;
# stb_image is compiled in instrumented for the paired-folder target (stb_image_impl.cpp).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "SHARDGAN_FUZZ needs clang++ (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
endif()
set(SHARDGAN_FUZZ_PREBUILT "${PROJECT_SOURCE_DIR}/build/libshardgan.a" CACHE FILEPATH
    "The gcc-built shardgan library the fuzz targets take their uninstrumented parts from")
if(NOT EXISTS "${SHARDGAN_FUZZ_PREBUILT}")
  message(FATAL_ERROR "shardgan: ${SHARDGAN_FUZZ_PREBUILT} not found: build the normal tree first "
                      "(cmake --build build --target shardgan)")
endif()
add_library(shardgan_prebuilt STATIC IMPORTED)
set_target_properties(shardgan_prebuilt PROPERTIES IMPORTED_LOCATION "${SHARDGAN_FUZZ_PREBUILT}")
find_library(SHARDGAN_GOMP gomp PATHS /usr/lib/gcc/x86_64-linux-gnu/12 /usr/lib/gcc/x86_64-linux-gnu/13)
set(SHARDGAN_FUZZ_COMPILE_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize=vptr
    -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1)
set(SHARDGAN_FUZZ_DEPS torch_cpu_library MPI::MPI_C spdlog::spdlog ${HDF5_C_LIBRARIES} yaml-cpp ZLIB::ZLIB stb xxhash
    PkgConfig::URING nlohmann_json::nlohmann_json ${SHARDGAN_GOMP} pthread)
if(SHARDGAN_HAVE_CUDA)
  list(APPEND SHARDGAN_FUZZ_DEPS ${CUDART_LIBRARY})
endif()
if(SHARDGAN_HAVE_NCCL)
  list(APPEND SHARDGAN_FUZZ_DEPS ${NCCL_LIBRARY})
endif()

# shardgan_fuzz_target(NAME SOURCES...): NAME_fuzz from tests/fuzz/NAME_fuzz.cpp and the
# shardgan sources (relative to the project root) to instrument.
function(shardgan_fuzz_target name)
  set(srcs)
  foreach(s ${ARGN})
    if(IS_ABSOLUTE ${s})
      list(APPEND srcs ${s})
    else()
      list(APPEND srcs ${PROJECT_SOURCE_DIR}/${s})
    endif()
  endforeach()
  add_executable(${name}_fuzz ${PROJECT_SOURCE_DIR}/tests/fuzz/${name}_fuzz.cpp ${srcs})
  target_include_directories(${name}_fuzz BEFORE PRIVATE ${SHARDGAN_INCLUDE_SHIM})
  target_include_directories(${name}_fuzz PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
                             ${PROJECT_SOURCE_DIR}/tests/fuzz ${PROJECT_BINARY_DIR}/generated ${HDF5_INCLUDE_DIRS})
  target_include_directories(${name}_fuzz SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
  target_compile_definitions(${name}_fuzz PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
                             SHARDGAN_FUZZ_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/fuzz/data")
  target_compile_options(${name}_fuzz PRIVATE ${SHARDGAN_TORCH_CXX_FLAGS} ${SHARDGAN_FUZZ_COMPILE_FLAGS})
  target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${name}_fuzz PRIVATE shardgan_prebuilt ${SHARDGAN_FUZZ_DEPS})
  add_dependencies(${name}_fuzz shardgan_version)
endfunction()

# clang 14 (Debian's) refuses lambdas that capture structured bindings (C++20; clang 16
# accepts them). A source that has one is compiled here from a copy in which that binding
# is spelled with std::tie; the copy is remade whenever the source changes, and the
# configure stops if the pattern is gone (then drop the entry).
function(shardgan_fuzz_clang14_copy src out_var pattern replacement)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${src})
  file(READ ${PROJECT_SOURCE_DIR}/${src} text)
  string(FIND "${text}" "${pattern}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "tests/fuzz/fuzz_targets.cmake: '${pattern}' is no longer in ${src}; drop its clang-14 copy")
  endif()
  string(REPLACE "${pattern}" "${replacement}" text "${text}")
  get_filename_component(name ${src} NAME)
  file(WRITE ${PROJECT_BINARY_DIR}/fuzz-src/${name} "// Generated from ${src} by tests/fuzz/fuzz_targets.cmake (clang 14).\n#line 1 \"${PROJECT_SOURCE_DIR}/${src}\"\n${text}")
  set(${out_var} ${PROJECT_BINARY_DIR}/fuzz-src/${name} PARENT_SCOPE)
endfunction()
shardgan_fuzz_clang14_copy(src/data/hdf5_dataset.cpp shardgan_fuzz_hdf5_dataset_cpp
  "auto [uniq, inverse] = at::_unique("
  "at::Tensor uniq, inverse; std::tie(uniq, inverse) = at::_unique(")

set(shardgan_fuzz_h5 src/h5/h5.cpp src/h5/core.cpp)
shardgan_fuzz_target(config src/train/config.cpp src/train/config_checkpoint.cpp src/train/config_dist.cpp
                     src/train/config_eval.cpp src/train/config_offload.cpp src/train/config_optim.cpp
                     src/train/config_placement.cpp src/train/config_run.cpp src/train/config_sharding.cpp
                     src/train/config_train.cpp src/util/config_reader.cpp)
# Not verify.cpp: the harness runs verify's checks itself, in-process (ckpt_exercise.h), and
# clang 14 refuses the file's lambdas that capture structured bindings (C++20, clang 16).
set(shardgan_fuzz_ckpt src/checkpoint/manifest.cpp src/checkpoint/shard_io.cpp src/checkpoint/index_layout.cpp
    ${shardgan_fuzz_h5})
shardgan_fuzz_target(ckpt_index ${shardgan_fuzz_ckpt})
shardgan_fuzz_target(ckpt_rankfile ${shardgan_fuzz_ckpt})
shardgan_fuzz_target(hdf5_dataset ${shardgan_fuzz_hdf5_dataset_cpp} ${shardgan_fuzz_h5})
shardgan_fuzz_target(paired_folder src/data/convert_paired.cpp src/data/convert.cpp tests/fuzz/stb_image_impl.cpp)
shardgan_fuzz_target(classifier src/eval/classifier.cpp ${shardgan_fuzz_h5})
