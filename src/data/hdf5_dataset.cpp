#include "shardgan/data/hdf5_dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include <torch/torch.h>

#include "h5/core.h"
#include "shardgan/h5/probe.h"
#include "shardgan/data/images.h"

namespace shardgan::data {
namespace {

// The largest image (C * H * W bytes) a file may declare: 2 GiB, far above any image the
// trainer takes (data.image_size is at most 4096).
constexpr int64_t kMaxImageBytes = int64_t{1} << 31;
// The most class names (root attribute `classes`) read, and the longest fixed-length name.
constexpr hsize_t kMaxClasses = hsize_t{1} << 24;
constexpr size_t kMaxClassNameBytes = size_t{1} << 16;

constexpr const char* kHint = " (BigGAN-PyTorch's layout: 'imgs' uint8 [N, C, H, W] and 'labels' int64 [N]; "
                              "write it with shardgan-data convert)";

// Names of the objects in the root group, for "the file holds ...".
std::string root_names(hid_t file) {
  std::vector<std::string> names;
  auto add = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  H5Literate(file, H5_INDEX_NAME, H5_ITER_INC, nullptr, add, &names);
  H5Eclear2(H5E_DEFAULT);
  if (names.empty()) return "nothing";
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s;
}

// Opens dataset `name` and checks its element type and rank; returns its extent.
h5::Hid open_checked(hid_t file, const std::string& path, const std::string& name, H5T_class_t cls, size_t bytes,
                   H5T_sign_t sign, const char* want, int rank, std::vector<hsize_t>* dims) {
  const std::string where = path + ": dataset '" + name + "'";
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw DataError(path + ": no dataset '" + name + "'; the file holds " + root_names(file) + kHint);
  }
  h5::Hid ds(h5::check<DataError>(H5Dopen2(file, name.c_str(), H5P_DEFAULT), where + ": cannot open it (not a dataset, or damaged)"),
              H5Dclose);
  h5::Hid type(h5::check<DataError>(H5Dget_type(ds.get()), where + ": cannot read its type"), H5Tclose);
  h5::Hid space(h5::check<DataError>(H5Dget_space(ds.get()), where + ": cannot read its shape"), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) h5::fail<DataError>(where + ": cannot read its rank");
  dims->assign(static_cast<size_t>(std::max(nd, 0)), 0);
  if (nd > 0 && H5Sget_simple_extent_dims(space.get(), dims->data(), nullptr) < 0) h5::fail<DataError>(where + ": cannot read its shape");
  std::string shape = "[";
  for (size_t i = 0; i < dims->size(); ++i) shape += (i ? ", " : "") + std::to_string((*dims)[i]);
  shape += "]";
  const bool type_ok = H5Tget_class(type.get()) == cls && H5Tget_size(type.get()) == bytes &&
                       (cls != H5T_INTEGER || H5Tget_sign(type.get()) == sign);
  if (!type_ok) {
    throw DataError(where + " has dtype " + h5::type_name(type.get()) + ", expected " + want + kHint);
  }
  if (nd != rank) {
    throw DataError(where + " has rank " + std::to_string(nd) + " (shape " + shape + "), expected rank " +
                    std::to_string(rank) + kHint);
  }
  return ds;
}

// Reads rows [start, start + count) of a dataset whose rows hold `row_numel` elements of `mem_type`.
void read_rows(hid_t ds, hid_t mem_type, const std::vector<hsize_t>& dims, int64_t start, int64_t count, void* out,
               const std::string& where) {
  h5::Hid fspace(h5::check<DataError>(H5Dget_space(ds), where + ": cannot read its shape"), H5Sclose);
  std::vector<hsize_t> off(dims.size(), 0), cnt(dims);
  off[0] = static_cast<hsize_t>(start);
  cnt[0] = static_cast<hsize_t>(count);
  h5::check_status<DataError>(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr),
             where + ": cannot select rows");
  hsize_t numel = 1;
  for (auto d : cnt) numel *= d;
  h5::Hid mspace(h5::check<DataError>(H5Screate_simple(1, &numel, nullptr), where + ": cannot make a memory space"), H5Sclose);
  h5::check_status<DataError>(H5Dread(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, out),
             where + ": reading rows [" + std::to_string(start) + ", " + std::to_string(start + count) +
                 ") failed (truncated or damaged file?)");
}

// Reads the rows `u` (sorted, distinct, int64 [m]) of `ds` into `dst` (m rows of
// `row_bytes` bytes), one hyperslab per run of consecutive rows. Returns the number of runs.
int64_t read_sorted_rows(hid_t ds, hid_t mem_type, const std::vector<hsize_t>& dims, const at::Tensor& u_sorted,
                         int64_t row_bytes, uint8_t* dst, const std::string& where) {
  const int64_t m = u_sorted.numel();
  const int64_t* u = u_sorted.data_ptr<int64_t>();
  int64_t runs = 0;
  for (int64_t i = 0; i < m;) {
    int64_t j = i + 1;
    while (j < m && u[j] == u[j - 1] + 1) ++j;  // rows u[i] .. u[j - 1] are consecutive
    read_rows(ds, mem_type, dims, u[i], j - i, dst + i * row_bytes, where);
    ++runs;
    i = j;
  }
  return runs;
}

}  // namespace

at::Tensor scale_pixels(const at::Tensor& raw, at::ScalarType dtype) {
  // The same three operations as load_fashion_mnist (src/data/images.cpp), element by
  // element, so that both give bit-identical values.
  return raw.to(dtype).div_(127.5).sub_(1.0);
}

Hdf5Dataset::Hdf5Dataset(std::string path) : path_(std::move(path)) {
  h5::quiet();
  if (!std::filesystem::exists(path_)) {
    throw DataError(path_ + ": no such file (data.path of data.source hdf5 names the .h5 file; write one with "
                            "shardgan-data convert)");
  }
  if (H5Fis_hdf5(path_.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw DataError(path_ + ": not an HDF5 file" + std::string(kHint));
  }
  // HDF5 first reads the file in a child (h5/probe.h): a crafted or corrupted file can crash
  // or hang Debian's libhdf5, which must cost an error here, not the rank.
  if (const std::string why = h5::probe_isolated(path_, {kImagesDataset, kLabelsDataset, kConditionDataset});
      !why.empty()) {
    throw DataError(path_ + ": " + why);
  }
  h5::Hid file(h5::check<DataError>(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path_ + ": cannot open the HDF5 file"),
                H5Fclose);
  std::vector<hsize_t> di, dl;
  h5::Hid imgs = open_checked(file.get(), path_, kImagesDataset, H5T_INTEGER, 1, H5T_SGN_NONE, "uint8 [N, C, H, W]", 4, &di);
  h5::Hid labels = open_checked(file.get(), path_, kLabelsDataset, H5T_INTEGER, 8, H5T_SGN_2, "int64 [N]", 1, &dl);
  n_ = static_cast<int64_t>(di[0]);
  c_ = static_cast<int64_t>(di[1]);
  h_ = static_cast<int64_t>(di[2]);
  w_ = static_cast<int64_t>(di[3]);
  if (n_ < 1 || c_ < 1 || h_ < 1 || w_ < 1) {
    throw DataError(path_ + ": dataset 'imgs' has shape [" + std::to_string(n_) + ", " + std::to_string(c_) + ", " +
                    std::to_string(h_) + ", " + std::to_string(w_) + "]: needs at least one image of at least 1x1x1");
  }
  // A declared extent is not stored data: a crafted file can claim any shape, and
  // C * H * W must not overflow (found by hdf5_dataset_fuzz), so images are bounded.
  int64_t image_bytes = 0, total = 0;
  if (__builtin_mul_overflow(c_, h_, &image_bytes) || __builtin_mul_overflow(image_bytes, w_, &image_bytes) ||
      image_bytes > kMaxImageBytes || __builtin_mul_overflow(image_bytes, n_, &total)) {
    throw DataError(path_ + ": dataset 'imgs' has shape [" + std::to_string(n_) + ", " + std::to_string(c_) + ", " +
                    std::to_string(h_) + ", " + std::to_string(w_) + "]: an image may hold at most " +
                    std::to_string(kMaxImageBytes) + " bytes (C * H * W)");
  }
  if (static_cast<int64_t>(dl[0]) != n_) {
    throw DataError(path_ + ": dataset 'labels' holds " + std::to_string(dl[0]) + " labels but 'imgs' holds " +
                    std::to_string(n_) + " images; they must match");
  }
  // Scan the labels in pieces: memory stays bounded for any N.
  const std::string where = path_ + ": dataset 'labels'";
  std::vector<int64_t> buf;
  min_label_ = INT64_MAX;
  max_label_ = INT64_MIN;
  for (int64_t s = 0; s < n_; s += 65536) {
    const int64_t k = std::min<int64_t>(65536, n_ - s);
    buf.resize(static_cast<size_t>(k));
    read_rows(labels.get(), H5T_NATIVE_INT64, dl, s, k, buf.data(), where);
    for (int64_t i = 0; i < k; ++i) {
      if (buf[i] < 0) {
        throw DataError(where + ": label " + std::to_string(s + i) + " is " + std::to_string(buf[i]) +
                        ", negative (labels are class indices 0, 1, ...)");
      }
    }
    auto [lo, hi] = std::minmax_element(buf.begin(), buf.end());
    min_label_ = std::min(min_label_, *lo);
    max_label_ = std::max(max_label_, *hi);
  }
  if (H5Lexists(file.get(), kConditionDataset, H5P_DEFAULT) > 0) {  // a file of pairs
    std::vector<hsize_t> da;
    h5::Hid a = open_checked(file.get(), path_, kConditionDataset, H5T_INTEGER, 1, H5T_SGN_NONE, "uint8 [N, C, H, W]", 4, &da);
    if (da[0] != di[0] || da[2] != di[2] || da[3] != di[3] || da[1] < 1 ||
        da[1] > static_cast<hsize_t>(kMaxImageBytes / (h_ * w_))) {
      throw DataError(path_ + ": dataset 'A' has shape [" + std::to_string(da[0]) + ", " + std::to_string(da[1]) + ", " +
                      std::to_string(da[2]) + ", " + std::to_string(da[3]) + "] but 'imgs' (B) holds " +
                      std::to_string(n_) + " images of " + std::to_string(h_) + "x" + std::to_string(w_) +
                      ": a pair's A and B must match in number and size");
    }
    ca_ = static_cast<int64_t>(da[1]);
    a_ = a.release();
  }
  H5Eclear2(H5E_DEFAULT);
  file_ = file.release();
  imgs_ = imgs.release();
  labels_ = labels.release();
}

Hdf5Dataset::~Hdf5Dataset() {
  if (a_ >= 0) H5Dclose(a_);
  if (labels_ >= 0) H5Dclose(labels_);
  if (imgs_ >= 0) H5Dclose(imgs_);
  if (file_ >= 0) H5Fclose(file_);
}

std::vector<std::string> Hdf5Dataset::class_names() const {
  h5::quiet();
  if (H5Aexists(file_, "classes") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return {};
  }
  const std::string where = path_ + ": attribute 'classes' of '/'";
  h5::Hid attr(h5::check<DataError>(H5Aopen(file_, "classes", H5P_DEFAULT), where + ": cannot open it"), H5Aclose);
  h5::Hid type(h5::check<DataError>(H5Aget_type(attr.get()), where + ": cannot read its type"), H5Tclose);
  h5::Hid space(h5::check<DataError>(H5Aget_space(attr.get()), where + ": cannot read its shape"), H5Sclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_ndims(space.get()) != 1) {
    throw DataError(where + ": expected a 1-D array of strings, found " + h5::type_name(type.get()));
  }
  hsize_t k = 0;
  H5Sget_simple_extent_dims(space.get(), &k, nullptr);
  // Bounded before sizing buffers from them (found by hdf5_dataset_fuzz: a crafted extent
  // made std::vector throw length_error).
  const size_t fixed_len = H5Tis_variable_str(type.get()) > 0 ? 0 : H5Tget_size(type.get());
  if (k > kMaxClasses || fixed_len > kMaxClassNameBytes) {
    throw DataError(where + ": holds " + std::to_string(k) + " names of " + std::to_string(fixed_len) +
                    " bytes; at most " + std::to_string(kMaxClasses) + " names of at most " +
                    std::to_string(kMaxClassNameBytes) + " bytes are read");
  }
  std::vector<std::string> names;
  if (H5Tis_variable_str(type.get()) > 0) {
    h5::Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    std::vector<char*> ptrs(k, nullptr);
    h5::check_status<DataError>(H5Aread(attr.get(), mem.get(), ptrs.data()), where + ": cannot read it");
    for (char* p : ptrs) names.emplace_back(p ? p : "");
    H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, ptrs.data());
  } else {
    const size_t len = H5Tget_size(type.get());
    std::vector<char> buf(k * len + 1, 0);
    h5::check_status<DataError>(H5Aread(attr.get(), type.get(), buf.data()), where + ": cannot read it");
    for (hsize_t i = 0; i < k; ++i) names.emplace_back(strnlen(&buf[i * len], len) == len ? std::string(&buf[i * len], len) : std::string(&buf[i * len]));
  }
  return names;
}

void Hdf5Dataset::check_labels(int64_t num_classes) const {
  if (max_label_ >= num_classes) {
    throw DataError(path_ + ": dataset 'labels' has labels up to " + std::to_string(max_label_) +
                    ", outside [0, " + std::to_string(num_classes) + "): the model has " + std::to_string(num_classes) +
                    " classes (model.n_classes)");
  }
}

void Hdf5Dataset::read_rows_raw(const at::Tensor& indices, at::Tensor* images, at::Tensor* labels,
                                ReadStats* stats, at::Tensor* condition) const {
  h5::quiet();
  TORCH_CHECK(indices.dim() == 1 && indices.scalar_type() == at::kLong, "Hdf5Dataset: indices must be int64 [n]");
  const at::Tensor idx = indices.contiguous();
  if (idx.numel() > 0) {
    const int64_t lo = idx.min().item<int64_t>(), hi = idx.max().item<int64_t>();
    if (lo < 0 || hi >= n_) {
      throw std::out_of_range(path_ + ": row " + std::to_string(lo < 0 ? lo : hi) + " requested, the file holds rows [0, " +
                              std::to_string(n_) + ")");
    }
  }
  // Distinct rows in file order; `inverse` puts them back in the requested order.
  auto [uniq, inverse] = at::_unique(idx, /*sorted=*/true, /*return_inverse=*/true);
  const int64_t m = uniq.numel();
  // The rows of a uint8 [N, c, H, W] dataset (`imgs`, or `A` of a file of pairs).
  auto read_images = [&](int64_t ds, int64_t c, const char* name, int64_t* runs) {
    const std::vector<hsize_t> dims{static_cast<hsize_t>(n_), static_cast<hsize_t>(c), static_cast<hsize_t>(h_),
                                    static_cast<hsize_t>(w_)};
    at::Tensor staging = torch::empty({m, c, h_, w_}, torch::kUInt8);
    *runs = read_sorted_rows(ds, H5T_NATIVE_UINT8, dims, uniq, c * h_ * w_, staging.data_ptr<uint8_t>(),
                             path_ + ": dataset '" + name + "'");
    return staging.index_select(0, inverse);
  };
  int64_t runs = 0;
  if (images) {
    *images = read_images(imgs_, c_, kImagesDataset, &runs);
    if (stats) {
      stats->runs += runs;
      stats->rows_read += m;
      stats->bytes_read += m * image_numel();
    }
  }
  if (condition) *condition = read_images(a_, ca_, kConditionDataset, &runs);
  if (labels) {
    const std::vector<hsize_t> dims{static_cast<hsize_t>(n_)};
    at::Tensor staging = torch::empty({m}, torch::kLong);
    read_sorted_rows(labels_, H5T_NATIVE_INT64, dims, uniq, sizeof(int64_t),
                     reinterpret_cast<uint8_t*>(staging.data_ptr<int64_t>()), path_ + ": dataset 'labels'");
    *labels = staging.index_select(0, inverse);
  }
}

at::Tensor Hdf5Dataset::read_condition(const at::Tensor& indices, at::ScalarType dtype) const {
  if (a_ < 0) throw std::logic_error(path_ + ": no dataset 'A' (not a file of pairs)");
  at::Tensor raw;
  read_rows_raw(indices, nullptr, nullptr, nullptr, &raw);
  return scale_pixels(raw, dtype);
}

at::Tensor Hdf5Dataset::read_raw(const at::Tensor& indices, ReadStats* stats) const {
  at::Tensor images;
  read_rows_raw(indices, &images, nullptr, stats);
  return images;
}

void Hdf5Dataset::read(const at::Tensor& indices, at::ScalarType dtype, at::Tensor* images, at::Tensor* labels,
                       ReadStats* stats) const {
  at::Tensor raw;
  read_rows_raw(indices, images ? &raw : nullptr, labels, stats);
  if (images) *images = scale_pixels(raw, dtype).contiguous();
}

}  // namespace shardgan::data
