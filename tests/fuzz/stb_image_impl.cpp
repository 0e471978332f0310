// stb_image's decoders compiled into the paired-folder fuzz target (clang build only), so
// that libFuzzer sees their coverage and ASan checks them. The program's own definitions
// take the place of Debian's libstb ones (the same header version, the same API).
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
