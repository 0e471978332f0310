# stb and xxHash: Debian's libraries (libstb-dev, libxxhash-dev) by default, or the header-only
# sources from a folder, for a machine without root (docs/install.md). Sets
# SHARDGAN_STB_LIBRARY and SHARDGAN_XXHASH_LIBRARY (what libshardgan links) and, for a folder,
# links its headers into ${SHARDGAN_INCLUDE_SHIM} and compiles their implementation once
# (cmake/header_only/*.cpp, added to libshardgan by the caller through
# SHARDGAN_HEADER_ONLY_SOURCES).
set(SHARDGAN_STB_DIR "" CACHE PATH "A folder with stb's stb_image.h, stb_image_write.h and \
stb_image_resize.h (a clone of github.com/nothings/stb; stb_image_resize.h may sit in its deprecated/); empty: Debian's libstb")
set(SHARDGAN_XXHASH_DIR "" CACHE PATH "A folder with xxHash's xxhash.h (a clone of \
github.com/Cyan4973/xxHash, 0.8 or later); empty: the system's libxxhash")
# shardgan_system_library(PREFIX LIB HEADER WHAT DIR_OPTION REPO): the installed library LIB
# with HEADER on the include path; sets PREFIX_LIBRARY, or stops naming WHAT, how to install
# it and the header-only alternative.
function(shardgan_system_library prefix lib header what dir_option repo)
  find_library(${prefix}_LIB ${lib})
  find_path(${prefix}_INC ${header})
  if(NOT ${prefix}_LIB OR NOT ${prefix}_INC)
    message(FATAL_ERROR "shardgan: ${what} not found. Install it (scripts/setup.sh), or set "
                        "-D${dir_option}=<a clone of github.com/${repo}> (docs/install.md)")
  endif()
  set(${prefix}_LIBRARY ${${prefix}_LIB} PARENT_SCOPE)
endfunction()

set(SHARDGAN_HEADER_ONLY_SOURCES "")

if(SHARDGAN_STB_DIR)
  file(MAKE_DIRECTORY ${SHARDGAN_INCLUDE_SHIM}/stb)
  foreach(h stb_image.h stb_image_write.h stb_image_resize.h)
    find_file(SHARDGAN_STB_${h} ${h} PATHS ${SHARDGAN_STB_DIR} ${SHARDGAN_STB_DIR}/deprecated ${SHARDGAN_STB_DIR}/stb
              NO_DEFAULT_PATH NO_CACHE)
    if(NOT SHARDGAN_STB_${h})
      message(FATAL_ERROR "shardgan: SHARDGAN_STB_DIR=${SHARDGAN_STB_DIR} has no ${h} (nor in deprecated/ or stb/). "
                          "Clone github.com/nothings/stb there, or leave SHARDGAN_STB_DIR empty for Debian's libstb-dev")
    endif()
    file(CREATE_LINK ${SHARDGAN_STB_${h}} ${SHARDGAN_INCLUDE_SHIM}/stb/${h} SYMBOLIC)
  endforeach()
  list(APPEND SHARDGAN_HEADER_ONLY_SOURCES ${PROJECT_SOURCE_DIR}/cmake/header_only/stb_impl.cpp)
  set(SHARDGAN_STB_LIBRARY "")
  message(STATUS "shardgan: stb header-only from ${SHARDGAN_STB_DIR}")
else()
  shardgan_system_library(SHARDGAN_STB stb stb/stb_image.h "stb (Debian's libstb-dev)" SHARDGAN_STB_DIR nothings/stb)
endif()

if(SHARDGAN_XXHASH_DIR)
  if(NOT EXISTS ${SHARDGAN_XXHASH_DIR}/xxhash.h)
    message(FATAL_ERROR "shardgan: SHARDGAN_XXHASH_DIR=${SHARDGAN_XXHASH_DIR} has no xxhash.h. Clone "
                        "github.com/Cyan4973/xxHash there, or leave it empty for the system's libxxhash")
  endif()
  file(CREATE_LINK ${SHARDGAN_XXHASH_DIR}/xxhash.h ${SHARDGAN_INCLUDE_SHIM}/xxhash.h SYMBOLIC)
  list(APPEND SHARDGAN_HEADER_ONLY_SOURCES ${PROJECT_SOURCE_DIR}/cmake/header_only/xxhash_impl.cpp)
  set(SHARDGAN_XXHASH_LIBRARY "")
  message(STATUS "shardgan: xxHash header-only from ${SHARDGAN_XXHASH_DIR}")
else()
  shardgan_system_library(SHARDGAN_XXHASH xxhash xxhash.h "xxHash (Debian's libxxhash-dev)" SHARDGAN_XXHASH_DIR
                          Cyan4973/xxHash)
endif()
