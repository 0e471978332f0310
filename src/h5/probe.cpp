#include "shardgan/h5/probe.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <hdf5.h>

#include "h5/checked.h"
#include "h5/core.h"
#include "shardgan/h5/h5.h"
#include "shardgan/util/isolate.h"

namespace shardgan::h5 {
namespace {

// The memory type a probe reads `ftype` with, or an empty handle for a class no shardgan
// reader reads (compound, enum, reference ...: their readers refuse the type first).
Hid probe_mem_type(hid_t ftype, bool* vlen) {
  *vlen = false;
  switch (H5Tget_class(ftype)) {
    case H5T_INTEGER:
    case H5T_FLOAT:
      return Hid{H5Tget_native_type(ftype, H5T_DIR_ASCEND), H5Tclose};
    case H5T_STRING:
      *vlen = H5Tis_variable_str(ftype) > 0;
      return Hid{H5Tcopy(ftype), H5Tclose};
    default:
      return {};
  }
}

// Reads `n` elements selected by `fspace` of dataset or attribute `obj` into a scratch
// buffer; variable-length strings are freed again.
void read_selection(hid_t obj, bool is_attr, hid_t mtype, bool vlen, hid_t fspace, hsize_t n,
                    const std::string& where) {
  const size_t es = H5Tget_size(mtype);
  if (es == 0) throw H5Error(where + ": an element type of size 0");
  std::vector<char> buf(static_cast<size_t>(n) * es);
  Hid mspace{check(H5Screate_simple(1, &n, nullptr), where + ": H5Screate_simple"), H5Sclose};
  if (is_attr) {
    check_status(H5Aread(obj, mtype, buf.data()), where + ": cannot be read");
  } else {
    check_status(H5Dread(obj, mtype, mspace.get(), fspace, H5P_DEFAULT, buf.data()), where + ": cannot be read");
  }
  if (vlen) H5Dvlen_reclaim(mtype, mspace.get(), H5P_DEFAULT, buf.data());
}

void probe_attribute(hid_t loc, const char* name, const std::string& owner) {
  const std::string where = owner + ", attribute '" + name + "'";
  Hid a{check(H5Aopen(loc, name, H5P_DEFAULT), where + ": cannot be opened"), H5Aclose};
  Hid ftype{check(H5Aget_type(a.get()), where + ": unreadable type"), H5Tclose};
  Hid space{check(H5Aget_space(a.get()), where + ": unreadable dataspace"), H5Sclose};
  bool vlen = false;
  Hid mtype = probe_mem_type(ftype.get(), &vlen);
  if (mtype.get() < 0) return;
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0) throw H5Error(where + ": unreadable extent");
  const size_t es = H5Tget_size(mtype.get());
  if (n == 0 || es == 0 || static_cast<unsigned long long>(n) > static_cast<unsigned long long>(kProbeFullReadBytes) / es) {
    return;  // empty, or too large for a probe: the reader checks its size before reading
  }
  read_selection(a.get(), true, mtype.get(), vlen, space.get(), static_cast<hsize_t>(n), where);
}

// The dataset's creation properties: layout, chunk shape, filters, virtual mappings.
void probe_layout(hid_t ds, const std::string& where) {
  Hid dcpl{check(H5Dget_create_plist(ds), where + ": unreadable creation properties"), H5Pclose};
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout < 0) throw H5Error(where + ": unreadable layout" + take_error_stack());
  if (layout == H5D_CHUNKED) {
    hsize_t chunk[H5S_MAX_RANK];
    if (H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, chunk) < 0) throw H5Error(where + ": unreadable chunk shape" + take_error_stack());
  }
  const int nf = H5Pget_nfilters(dcpl.get());
  if (nf < 0) throw H5Error(where + ": unreadable filters" + take_error_stack());
  for (int i = 0; i < nf; ++i) {
    unsigned flags = 0, conf = 0;
    size_t nvals = 8;
    unsigned vals[8];
    char fname[64];
    if (H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nvals, vals, sizeof(fname), fname, &conf) < 0) {
      throw H5Error(where + ": unreadable filter " + std::to_string(i) + take_error_stack());
    }
  }
  if (layout == H5D_VIRTUAL) {
    size_t n = 0;
    check_status(H5Pget_virtual_count(dcpl.get(), &n), where + ": unreadable virtual mappings");
    for (size_t i = 0; i < n; ++i) {
      const std::string m = where + ": virtual mapping " + std::to_string(i);
      Hid vs{check(H5Pget_virtual_vspace(dcpl.get(), i), m), H5Sclose};
      Hid ss{check(H5Pget_virtual_srcspace(dcpl.get(), i), m), H5Sclose};
      if (H5Pget_virtual_filename(dcpl.get(), i, nullptr, 0) < 0 || H5Pget_virtual_dsetname(dcpl.get(), i, nullptr, 0) < 0) {
        throw H5Error(m + ": unreadable source name" + take_error_stack());
      }
    }
  }
}

// Reads a named dataset: whole up to kProbeFullReadBytes, else its first and last rows (or
// elements). Never a virtual dataset's data (that would read every source file).
void probe_data(hid_t ds, const std::string& where) {
  Hid dcpl{check(H5Dget_create_plist(ds), where + ": unreadable creation properties"), H5Pclose};
  if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) return;
  Hid ftype{check(H5Dget_type(ds), where + ": unreadable type"), H5Tclose};
  Hid space{check(H5Dget_space(ds), where + ": unreadable dataspace"), H5Sclose};
  bool vlen = false;
  Hid mtype = probe_mem_type(ftype.get(), &vlen);
  if (mtype.get() < 0) return;
  const size_t es = H5Tget_size(mtype.get());
  const int rank = H5Sget_simple_extent_ndims(space.get());
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (rank < 0 || n < 0 || rank > H5S_MAX_RANK) throw H5Error(where + ": unreadable extent" + take_error_stack());
  if (n == 0 || es == 0) return;
  const auto limit = static_cast<unsigned long long>(kProbeFullReadBytes) / es;
  if (static_cast<unsigned long long>(n) <= limit) {
    check_status(H5Sselect_all(space.get()), where + ": H5Sselect_all");
    read_selection(ds, false, mtype.get(), vlen, space.get(), static_cast<hsize_t>(n), where);
    return;
  }
  if (rank == 0) return;  // a scalar larger than the bound: not a type a reader reads
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  // A row: one index of dimension 0, all of the others; one element when a row is too large.
  unsigned long long row = 1;
  bool whole_rows = true;
  for (int d = 1; d < rank && whole_rows; ++d) {
    if (row > limit / dims[d]) whole_rows = false;  // dims[d] > 0: n > 0
    row *= dims[d];
  }
  whole_rows = whole_rows && row <= limit;
  for (hsize_t r : {hsize_t{0}, dims[0] - 1}) {
    std::vector<hsize_t> start(dims.size(), 0), count(dims.size(), 1);
    start[0] = r;
    if (whole_rows) std::copy(dims.begin() + 1, dims.end(), count.begin() + 1);
    check_status(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                 where + ": H5Sselect_hyperslab");
    read_selection(ds, false, mtype.get(), vlen, space.get(), whole_rows ? row : 1, where);
  }
}

struct Walk {
  std::set<std::string> datasets;  // names without a leading '/'
  std::string error;               // the first failure, which stops the visit
};

herr_t visit_object(hid_t root, const char* name, const H5O_info_t* info, void* data) {
  auto* w = static_cast<Walk*>(data);
  const std::string obj = std::strcmp(name, ".") == 0 ? "/" : name;
  const std::string where = "object '" + obj + "'";
  try {
    Hid o{check(H5Oopen(root, name, H5P_DEFAULT), where + ": cannot be opened"), H5Oclose};
    struct Attrs {
      std::string owner, error;
    } attrs{where, {}};
    auto attr_cb = [](hid_t loc, const char* an, const H5A_info_t*, void* d) -> herr_t {
      auto* at = static_cast<Attrs*>(d);
      try {
        probe_attribute(loc, an, at->owner);
      } catch (const std::exception& e) {
        at->error = e.what();
        return -1;
      }
      return 0;
    };
    hsize_t idx = 0;
    const herr_t rc = H5Aiterate2(o.get(), H5_INDEX_NAME, H5_ITER_NATIVE, &idx, attr_cb, &attrs);
    if (!attrs.error.empty()) throw H5Error(attrs.error);
    check_status(rc, where + ": its attributes cannot be listed");
    if (info->type == H5O_TYPE_DATASET) {
      Hid ds{check(H5Dopen2(root, name, H5P_DEFAULT), where + ": cannot be opened as a dataset"), H5Dclose};
      Hid t{check(H5Dget_type(ds.get()), where + ": unreadable type"), H5Tclose};
      Hid s{check(H5Dget_space(ds.get()), where + ": unreadable dataspace"), H5Sclose};
      probe_layout(ds.get(), where);
      if (w->datasets.count(obj) != 0 || w->datasets.count("*") != 0) probe_data(ds.get(), where);
    }
  } catch (const std::exception& e) {
    w->error = e.what();
    return -1;
  }
  return 0;
}

std::atomic<bool>& probing() {
  static std::atomic<bool> on{true};
  return on;
}

// The files probe_isolated found clean: (path, size, modification time in ns).
using Seen = std::tuple<std::string, long long, long long>;
std::mutex& seen_mutex() {
  static std::mutex mu;
  return mu;
}
std::set<Seen>& seen() {
  static std::set<Seen> s;
  return s;
}

}  // namespace

double probe_deadline_s() {
  const char* e = std::getenv("SHARDGAN_HDF5_PROBE_DEADLINE_S");
  if (e == nullptr || *e == '\0') return kProbeDeadlineS;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(e, &end);
  if (errno != 0 || end == e || *end != '\0' || !(v > 0)) {
    throw std::invalid_argument(std::string("SHARDGAN_HDF5_PROBE_DEADLINE_S='") + e +
                                "': expected a number of seconds > 0 (the deadline for probing an HDF5 file)");
  }
  return v;
}

void probe_read(const std::string& path, const std::vector<std::string>& datasets) {
  quiet();
  Hid f{check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
              "cannot open HDF5 file '" + path + "' (missing, truncated or not HDF5)"),
        H5Fclose};
  Walk w{{}, {}};
  for (const std::string& d : datasets) w.datasets.insert(d.empty() || d[0] != '/' ? d : d.substr(1));
  const herr_t rc = H5Ovisit2(f.get(), H5_INDEX_NAME, H5_ITER_NATIVE, visit_object, &w, H5O_INFO_ALL);
  if (!w.error.empty()) throw H5Error(path + ": " + w.error);
  check_status(rc, path + ": an object header cannot be decoded");
}

void set_probing(bool on) { probing().store(on); }

std::string probe_isolated(const std::string& path, const std::vector<std::string>& datasets, double deadline_s) {
  if (!probing().load()) return "";
  if (deadline_s < 0) deadline_s = probe_deadline_s();
  struct stat st {};
  const bool have = ::stat(path.c_str(), &st) == 0;
  const Seen key{path, have ? static_cast<long long>(st.st_size) : -1,
                 have ? static_cast<long long>(st.st_mtim.tv_sec) * 1000000000ll + st.st_mtim.tv_nsec : -1};
  {
    std::lock_guard<std::mutex> lk(seen_mutex());
    if (have && seen().count(key) != 0) return "";
  }
  const IsolatedResult r = run_isolated(
      path,
      [&](std::vector<std::string>& out) {
        try {
          probe_read(path, datasets);
        } catch (const std::exception& e) {
          out.push_back(e.what());
        }
      },
      deadline_s);
  std::string why;
  if (r.timed_out) {
    std::ostringstream os;
    os << "reading its HDF5 metadata did not finish within " << deadline_s
       << " s (HDF5 loops on some corrupted files; on slow storage, raise SHARDGAN_HDF5_PROBE_DEADLINE_S)";
    why = os.str();
  } else if (r.signal != 0) {
    why = "the HDF5 library " + r.failure() + " reading its metadata: the file is corrupted or crafted";
  } else if (!r.problems.empty()) {
    why = r.problems.front();
    const std::string prefix = path + ": ";
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
  } else if (r.exit_status != 0) {
    why = "probing it " + r.failure();
  }
  if (why.empty() && have) {
    std::lock_guard<std::mutex> lk(seen_mutex());
    seen().insert(key);
  }
  return why;
}

}  // namespace shardgan::h5
