#include "h5/core.h"

namespace shardgan::h5 {
namespace {

herr_t walk(unsigned n, const H5E_error2_t* e, void* data) {
  auto* s = static_cast<std::string*>(data);
  *s += "\n  #" + std::to_string(n) + " " + (e->func_name ? e->func_name : "?") + ": " + (e->desc ? e->desc : "");
  return 0;
}

}  // namespace

void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string take_error_stack() {
  std::string stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &stack);
  H5Eclear2(H5E_DEFAULT);
  return stack.empty() ? std::string() : "; HDF5 says:" + stack;
}

std::string type_name(hid_t type) {
  const size_t bytes = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(8 * bytes);
    case H5T_FLOAT: return "float" + std::to_string(8 * bytes);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield";
    case H5T_REFERENCE: return "reference";
    default: return "an unknown type";
  }
}

}  // namespace shardgan::h5
