// stb's implementation, compiled once into libshardgan when stb comes header-only from
// SHARDGAN_STB_DIR (cmake/header_only_deps.cmake) instead of Debian's libstb.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
