#include "shardgan/h5/h5.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <hdf5.h>

#include "h5/checked.h"
#include "h5/core.h"
#include "h5/inspect.h"

namespace shardgan::h5 {
namespace {

[[noreturn]] void fail(const std::string& what) { h5::fail<H5Error>(what); }
using Handle = Hid;

hid_t mem_type(DType t) {
  switch (t) {
    case DType::kF32: return H5T_NATIVE_FLOAT;
    case DType::kF64: return H5T_NATIVE_DOUBLE;
    case DType::kI64: return H5T_NATIVE_INT64;
    case DType::kU8: return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

hid_t file_type(DType t) {
  switch (t) {
    case DType::kF32: return H5T_IEEE_F32LE;
    case DType::kF64: return H5T_IEEE_F64LE;
    case DType::kI64: return H5T_STD_I64LE;
    case DType::kU8: return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

struct SilenceAuto {  // we report errors ourselves
  SilenceAuto() { quiet(); }
};
const SilenceAuto silence_auto;

}  // namespace

int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 1;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
  }
  return "?";
}

File File::create(const std::string& path) {
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) fail("cannot create HDF5 file '" + path + "'");
  return File(id, path);
}

File File::open_read(const std::string& path) {
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) fail("cannot open HDF5 file '" + path + "' (missing, truncated or not HDF5)");
  return File(id, path);
}

File File::open_rw(const std::string& path) {
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (id < 0) fail("cannot open HDF5 file '" + path + "' for writing");
  return File(id, path);
}

File::File(File&& o) noexcept : id_(o.id_), path_(std::move(o.path_)) { o.id_ = -1; }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0) H5Fclose(id_);
    id_ = o.id_;
    path_ = std::move(o.path_);
    o.id_ = -1;
  }
  return *this;
}

File::~File() {
  if (id_ >= 0) H5Fclose(id_);
}

void File::close() {
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = -1;
  check_status(H5Fclose(id), path_ + ": close failed");
}

void File::flush() { check_status(H5Fflush(id_, H5F_SCOPE_GLOBAL), path_ + ": flush failed"); }

void File::write(const std::string& path, DType dt, const std::vector<int64_t>& shape,
                 const void* data) {
  const std::string where = path_ + ":/" + path;
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space{check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     where + ": bad shape"), H5Sclose};
  Handle lcpl{check(H5Pcreate(H5P_LINK_CREATE), where), H5Pclose};
  check_status(H5Pset_create_intermediate_group(lcpl.get(), 1), where);
  Handle ds{check(H5Dcreate2(id_, path.c_str(), file_type(dt), space.get(), lcpl.get(), H5P_DEFAULT,
                             H5P_DEFAULT), where + ": cannot create dataset"), H5Dclose};
  check_status(H5Dwrite(ds.get(), mem_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
               where + ": write failed");
}

std::vector<int64_t> File::shape(const std::string& path) const {
  const std::string where = path_ + ":/" + path;
  Handle ds{check(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), where + ": no such dataset"), H5Dclose};
  Handle space{check(H5Dget_space(ds.get()), where), H5Sclose};
  int nd = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

void File::read(const std::string& path, DType dt, void* out, int64_t numel) const {
  const std::string where = path_ + ":/" + path;
  int64_t n = 1;
  for (int64_t d : shape(path)) n *= d;
  if (n != numel) {
    throw H5Error(where + ": holds " + std::to_string(n) + " elements, expected " +
                  std::to_string(numel) + " (checkpoint from a different model or config?)");
  }
  Handle ds{check(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), where + ": no such dataset"), H5Dclose};
  Handle ft{check(H5Dget_type(ds.get()), where), H5Tclose};
  if (H5Tget_class(ft.get()) != H5Tget_class(mem_type(dt))) {
    throw H5Error(where + ": stored type class differs from the expected " + dtype_name(dt));
  }
  check_status(H5Dread(ds.get(), mem_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, out),
               where + ": read failed (corrupt or truncated file?)");
}

void File::read_range(const std::string& path, DType dt, int64_t start, int64_t count,
                      void* out) const {
  read_ranges(path, dt, {Range{start, count, out}});
}

void File::read_ranges(const std::string& path, DType dt, const std::vector<Range>& ranges,
                       const std::function<void(size_t)>& done) const {
  const std::string where = path_ + ":/" + path;
  Handle ds{check(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), where + ": no such dataset"), H5Dclose};
  Handle space{check(H5Dget_space(ds.get()), where), H5Sclose};
  // Flat shards are 1-D. A replicated buffer keeps its own shape (e.g. a spectral-norm u
  // vector [1, out]); it is read whole, as its elements in row-major order.
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  if (ndims < 1 || ndims > 8) throw H5Error(where + ": not a 1-D to 8-D dataset");
  hsize_t dims[8] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  hsize_t n = 1;
  for (int d = 0; d < ndims; ++d) n *= dims[d];
  if (ndims > 1) {
    for (const Range& r : ranges) {
      if (r.count > 0 && (r.start != 0 || static_cast<hsize_t>(r.count) != n)) {
        throw H5Error(where + ": a " + std::to_string(ndims) + "-D dataset can only be read whole");
      }
    }
  }
  for (const Range& r : ranges) {
    if (r.start < 0 || r.count < 0 || static_cast<hsize_t>(r.start + r.count) > n) {
      throw H5Error(where + ": range [" + std::to_string(r.start) + ", " +
                    std::to_string(r.start + r.count) + ") is outside its " + std::to_string(n) +
                    " elements");
    }
  }
  Handle ft{check(H5Dget_type(ds.get()), where), H5Tclose};
  if (H5Tget_class(ft.get()) != H5Tget_class(mem_type(dt))) {
    throw H5Error(where + ": stored type class differs from the expected " + dtype_name(dt));
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.count > 0) {
      const hsize_t st = static_cast<hsize_t>(r.start), ct = static_cast<hsize_t>(r.count);
      if (ndims == 1) {
        check_status(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &st, nullptr, &ct, nullptr), where);
      } else {
        check_status(H5Sselect_all(space.get()), where);
      }
      Handle mem{check(H5Screate_simple(1, &ct, nullptr), where), H5Sclose};
      check_status(H5Dread(ds.get(), mem_type(dt), mem.get(), space.get(), H5P_DEFAULT, r.out),
                   where + ": read of elements [" + std::to_string(r.start) + ", " +
                       std::to_string(r.start + r.count) + ") failed (corrupt or truncated file?)");
    }
    if (done) done(i);
  }
}

void File::advise_sequential() const {
  Handle fapl{H5Fget_access_plist(id_), H5Pclose};
  if (fapl.get() < 0 || H5Pget_driver(fapl.get()) != H5FD_SEC2) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
  void* handle = nullptr;
  if (H5Fget_vfd_handle(id_, fapl.get(), &handle) < 0 || handle == nullptr) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
  ::posix_fadvise(*static_cast<int*>(handle), 0, 0, POSIX_FADV_SEQUENTIAL);
}

DType File::dtype(const std::string& path) const {
  const std::string where = path_ + ":/" + path;
  Handle ds{check(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), where + ": no such dataset"), H5Dclose};
  Handle ft{check(H5Dget_type(ds.get()), where), H5Tclose};
  for (DType t : {DType::kF32, DType::kF64, DType::kI64, DType::kU8}) {
    if (H5Tequal(ft.get(), file_type(t)) > 0) return t;
  }
  throw H5Error(where + ": element type is none of float32, float64, int64, uint8");
}

int64_t File::data_offset(const std::string& path) const {
  const std::string where = path_ + ":/" + path;
  Handle ds{check(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), where + ": no such dataset"), H5Dclose};
  haddr_t a = H5Dget_offset(ds.get());
  if (a == HADDR_UNDEF) throw H5Error(where + ": not a contiguous dataset with data");
  return static_cast<int64_t>(a);
}

void File::write_string(const std::string& path, const std::string& text) {
  const std::string where = path_ + ":/" + path;
  Handle t{check(H5Tcopy(H5T_C_S1), where), H5Tclose};
  check_status(H5Tset_size(t.get(), std::max<size_t>(1, text.size())), where);
  check_status(H5Tset_cset(t.get(), H5T_CSET_UTF8), where);
  Handle space{check(H5Screate(H5S_SCALAR), where), H5Sclose};
  Handle lcpl{check(H5Pcreate(H5P_LINK_CREATE), where), H5Pclose};
  check_status(H5Pset_create_intermediate_group(lcpl.get(), 1), where);
  Handle ds{check(H5Dcreate2(id_, path.c_str(), t.get(), space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                  where + ": cannot create dataset"), H5Dclose};
  std::string buf = text.empty() ? std::string(1, '\0') : text;
  check_status(H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()),
               where + ": write failed");
}

std::string File::read_string(const std::string& path) const {
  const std::string where = path_ + ":/" + path;
  Handle ds{check(H5Dopen2(id_, path.c_str(), H5P_DEFAULT), where + ": no such dataset"), H5Dclose};
  Handle t{check(H5Dget_type(ds.get()), where), H5Tclose};
  if (H5Tget_class(t.get()) != H5T_STRING || H5Tis_variable_str(t.get()) > 0) {
    throw H5Error(where + ": not a fixed-length string dataset");
  }
  const size_t n = H5Tget_size(t.get());
  std::string s(n, '\0');
  check_status(H5Dread(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()),
               where + ": read failed (corrupt or truncated file?)");
  s.resize(strnlen(s.data(), n));
  return s;
}

void File::write_virtual(const std::string& path, DType dt, const std::vector<int64_t>& shape,
                         const std::vector<VirtualPiece>& pieces) {
  const std::string where = path_ + ":/" + path;
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle vspace{check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                      where + ": bad shape"), H5Sclose};
  Handle dcpl{check(H5Pcreate(H5P_DATASET_CREATE), where), H5Pclose};
  for (const VirtualPiece& p : pieces) {
    if (p.start.size() != dims.size() || p.count.size() != dims.size()) {
      throw H5Error(where + ": a piece's box has the wrong rank");
    }
    hsize_t numel = 1;
    for (int64_t c : p.count) numel *= static_cast<hsize_t>(c);
    std::vector<hsize_t> st(p.start.begin(), p.start.end()), ct(p.count.begin(), p.count.end());
    check_status(H5Sselect_hyperslab(vspace.get(), H5S_SELECT_SET, st.data(), nullptr, ct.data(),
                                     nullptr), where + ": bad box");
    const hsize_t src_dim = static_cast<hsize_t>(p.src_numel), src_st = p.src_start;
    Handle sspace{check(H5Screate_simple(1, &src_dim, nullptr), where), H5Sclose};
    check_status(H5Sselect_hyperslab(sspace.get(), H5S_SELECT_SET, &src_st, nullptr, &numel, nullptr),
                 where);
    check_status(H5Pset_virtual(dcpl.get(), vspace.get(), p.src_file.c_str(), p.src_dataset.c_str(),
                                sspace.get()), where + ": H5Pset_virtual failed");
  }
  check_status(H5Sselect_all(vspace.get()), where);
  Handle lcpl{check(H5Pcreate(H5P_LINK_CREATE), where), H5Pclose};
  check_status(H5Pset_create_intermediate_group(lcpl.get(), 1), where);
  Handle ds{check(H5Dcreate2(id_, path.c_str(), file_type(dt), vspace.get(), lcpl.get(), dcpl.get(),
                             H5P_DEFAULT), where + ": cannot create virtual dataset"), H5Dclose};
}

bool File::exists(const std::string& path) const {
  // Check each prefix: H5Lexists fails on a missing intermediate group.
  size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    std::string prefix = path.substr(0, pos);
    if (H5Lexists(id_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

namespace {

void write_attr(hid_t file, const std::string& fpath, const std::string& obj,
                const std::string& name, hid_t type, const void* v) {
  const std::string where = fpath + ":" + obj + "@" + name;
  if (H5Aexists_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT) > 0) {
    check_status(H5Adelete_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT), where);
  }
  Handle space{check(H5Screate(H5S_SCALAR), where), H5Sclose};
  Handle a{check(H5Acreate_by_name(file, obj.c_str(), name.c_str(), type, space.get(), H5P_DEFAULT,
                                   H5P_DEFAULT, H5P_DEFAULT), where + ": cannot create attribute"),
           H5Aclose};
  check_status(H5Awrite(a.get(), type, v), where);
}

hid_t open_attr(hid_t file, const std::string& fpath, const std::string& obj,
                const std::string& name) {
  hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0) fail(fpath + ":" + obj + "@" + name + ": missing attribute");
  return a;
}

}  // namespace

void File::set_attr(const std::string& obj, const std::string& name, int64_t v) {
  write_attr(id_, path_, obj, name, H5T_NATIVE_INT64, &v);
}

void File::set_attr(const std::string& obj, const std::string& name, double v) {
  write_attr(id_, path_, obj, name, H5T_NATIVE_DOUBLE, &v);
}

void File::set_attr(const std::string& obj, const std::string& name, const std::string& v) {
  Handle t{check(H5Tcopy(H5T_C_S1), path_), H5Tclose};
  check_status(H5Tset_size(t.get(), std::max<size_t>(1, v.size())), path_);
  check_status(H5Tset_cset(t.get(), H5T_CSET_UTF8), path_);
  std::string buf = v.empty() ? std::string(1, '\0') : v;
  write_attr(id_, path_, obj, name, t.get(), buf.data());
}

int64_t File::attr_int(const std::string& obj, const std::string& name) const {
  Handle a{open_attr(id_, path_, obj, name), H5Aclose};
  int64_t v = 0;
  check_status(H5Aread(a.get(), H5T_NATIVE_INT64, &v), path_ + ":" + obj + "@" + name);
  return v;
}

double File::attr_double(const std::string& obj, const std::string& name) const {
  Handle a{open_attr(id_, path_, obj, name), H5Aclose};
  double v = 0;
  check_status(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v), path_ + ":" + obj + "@" + name);
  return v;
}

std::string File::attr_string(const std::string& obj, const std::string& name) const {
  Handle a{open_attr(id_, path_, obj, name), H5Aclose};
  Handle t{check(H5Aget_type(a.get()), path_), H5Tclose};
  size_t n = H5Tget_size(t.get());
  std::string s(n, '\0');
  check_status(H5Aread(a.get(), t.get(), s.data()), path_ + ":" + obj + "@" + name);
  s.resize(strnlen(s.data(), n));
  return s;
}

VirtualLayouts::VirtualLayouts(const std::string& path) : path_(path) {
  id_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id_ < 0) fail("cannot open HDF5 file '" + path + "' (missing, truncated or not HDF5)");
}

VirtualLayouts::~VirtualLayouts() {
  if (id_ >= 0) H5Fclose(id_);
}

namespace {

// The one box a selection covers: its bounds, checked to hold exactly as many elements as
// the selection (a scattered or multi-block selection is no box).
void selection_box(hid_t space, const std::string& where, std::vector<int64_t>& start,
                   std::vector<int64_t>& count) {
  const int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 1 || nd > 32) throw H5Error(where + ": a mapping's dataspace has rank " + std::to_string(nd));
  std::vector<hsize_t> dims(static_cast<size_t>(nd)), lo(dims.size()), hi(dims.size());
  if (H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) fail(where + ": unreadable mapping dataspace");
  const hssize_t npoints = H5Sget_select_npoints(space);
  if (npoints <= 0) throw H5Error(where + ": a mapping selects no elements");
  check_status(H5Sget_select_bounds(space, lo.data(), hi.data()), where + ": bad mapping selection");
  start.assign(dims.size(), 0);
  count.assign(dims.size(), 0);
  hsize_t boxed = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (hi[d] < lo[d] || hi[d] >= dims[d]) throw H5Error(where + ": a mapping's selection is out of bounds");
    start[d] = static_cast<int64_t>(lo[d]);
    count[d] = static_cast<int64_t>(hi[d] - lo[d] + 1);
    boxed *= hi[d] - lo[d] + 1;
  }
  if (boxed != static_cast<hsize_t>(npoints)) throw H5Error(where + ": a mapping's selection is not one box");
}

std::string mapping_name(hid_t dcpl, size_t i, bool file, const std::string& where) {
  auto get = [&](char* buf, size_t n) {
    return file ? H5Pget_virtual_filename(dcpl, i, buf, n) : H5Pget_virtual_dsetname(dcpl, i, buf, n);
  };
  const ssize_t len = get(nullptr, 0);
  if (len < 0 || len > (1 << 20)) fail(where + ": unreadable mapping source name");
  std::string s(static_cast<size_t>(len) + 1, '\0');
  if (get(s.data(), s.size()) < 0) fail(where + ": unreadable mapping source name");
  s.resize(static_cast<size_t>(len));
  return s;
}

}  // namespace

std::vector<File::VirtualPiece> VirtualLayouts::pieces(const std::string& dataset) const {
  const std::string where = path_ + ":/" + dataset;
  Handle ds{check(H5Dopen2(id_, dataset.c_str(), H5P_DEFAULT), where + ": no such dataset"), H5Dclose};
  Handle dcpl{check(H5Dget_create_plist(ds.get()), where), H5Pclose};
  if (H5Pget_layout(dcpl.get()) != H5D_VIRTUAL) fail(where + ": not a virtual dataset");
  size_t n = 0;
  check_status(H5Pget_virtual_count(dcpl.get(), &n), where + ": unreadable mappings");
  std::vector<File::VirtualPiece> out;
  for (size_t i = 0; i < n; ++i) {
    File::VirtualPiece p;
    p.src_file = mapping_name(dcpl.get(), i, true, where);
    p.src_dataset = mapping_name(dcpl.get(), i, false, where);
    Handle vs{check(H5Pget_virtual_vspace(dcpl.get(), i), where + ": unreadable mapping"), H5Sclose};
    Handle ss{check(H5Pget_virtual_srcspace(dcpl.get(), i), where + ": unreadable mapping"), H5Sclose};
    selection_box(vs.get(), where, p.start, p.count);
    std::vector<int64_t> s0, c0;
    selection_box(ss.get(), where, s0, c0);
    if (s0.size() != 1) throw H5Error(where + ": a mapping's source is not 1-D");
    p.src_start = s0[0];
    p.src_numel = -1;  // HDF5 keeps the source's selection, not its extent
    out.push_back(std::move(p));
  }
  return out;
}

void check_object_headers(const std::string& path) {
  Handle f{check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
                 "cannot open HDF5 file '" + path + "' (missing, truncated or not HDF5)"),
           H5Fclose};
  // HDF5 1.10 decodes a version-1 object header whose prefix counts fewer messages than the
  // header holds (it would rewrite the count if the file were writable); HDF5 1.14 and 2.0,
  // which newer h5py wheels carry, refuse it ("bad object header message count"). So the
  // prefix's count (2 bytes at offset 2) must equal the messages HDF5 decoded.
  struct Scan {
    int fd;
    std::string bad;
  } scan{::open(path.c_str(), O_RDONLY), {}};
  if (scan.fd < 0) throw std::runtime_error("cannot open '" + path + "' to check its object headers");
  auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    auto* s = static_cast<Scan*>(data);
    if (info->hdr.version != 1) return 0;
    unsigned char pfx[2] = {0, 0};
    if (::pread(s->fd, pfx, 2, static_cast<off_t>(info->addr) + 2) != 2 ||
        static_cast<unsigned>(pfx[0] | (pfx[1] << 8)) != info->hdr.nmesgs) {
      s->bad = std::string("object '") + name + "': its header prefix counts another number of messages than it holds";
      return 1;  // stop the visit
    }
    return 0;
  };
  const herr_t rc = H5Ovisit2(f.get(), H5_INDEX_NAME, H5_ITER_NATIVE, visit, &scan, H5O_INFO_ALL);
  ::close(scan.fd);
  if (!scan.bad.empty()) throw std::runtime_error(path + ": " + scan.bad);
  check_status(rc, path + ": an object header cannot be decoded");
}

namespace {

// Whether this fsync_path call is one SHARDGAN_TEST_FSYNC_FAULTS plans to fail.
bool fsync_fault_planned() {
  static const char* plan = std::getenv("SHARDGAN_TEST_FSYNC_FAULTS");
  if (plan == nullptr) return false;
  static std::atomic<long long> calls{0};
  const long long i = calls++;
  const std::string text = std::string(",") + plan + ",";
  if (text.find("," + std::to_string(i) + ",") == std::string::npos) return false;
  std::fprintf(stderr, "shardgan: injected fsync fault (EIO) at fsync call %lld (SHARDGAN_TEST_FSYNC_FAULTS)\n", i);
  return true;
}

}  // namespace

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "' to fsync it: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  if (fsync_fault_planned()) rc = -1, err = EIO;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("fsync of '" + path + "' failed: " + std::strerror(err));
}

}  // namespace shardgan::h5
