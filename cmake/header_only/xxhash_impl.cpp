// xxHash's implementation, compiled once into libshardgan when xxHash comes header-only from
// SHARDGAN_XXHASH_DIR (cmake/header_only_deps.cmake) instead of the system's libxxhash.
#define XXH_STATIC_LINKING_ONLY
#define XXH_IMPLEMENTATION
#include <xxhash.h>
