# Writes ${OUT}: the version header that --version and the run log print (src/train/build_info.cpp
# includes it). Run at every build (the shardgan_version target), so the commit it names is the
# one the binary was built from, with "-dirty" when tracked files had uncommitted changes.
# file(CONFIGURE) leaves the header untouched when its text is unchanged, so an unchanged
# commit rebuilds nothing.
#   cmake -DSRC=<source dir> -DOUT=<header> -DVERSION=<x.y.z> -P write_version.cmake
execute_process(COMMAND git describe --always --dirty --abbrev=7 --match=NeVeR WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
endif()
file(CONFIGURE OUTPUT ${OUT} CONTENT
  "#pragma once\n#define SHARDGAN_VERSION \"${VERSION}\"\n#define SHARDGAN_GIT_COMMIT \"${commit}\"\n")
