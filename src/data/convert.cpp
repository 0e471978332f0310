#include "shardgan/data/convert.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <utility>

#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>  // the implementation is in Debian's libstb, linked into shardgan
#include <torch/torch.h>

#include "h5/core.h"
#include "shardgan/data/edges.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/images.h"
#include "data/image_files.h"

namespace fs = std::filesystem;

namespace shardgan::data {

const std::vector<std::string> kFashionMnistClassNames = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                          "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

namespace {

void fsync_or_throw(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(path + ": cannot open to fsync " + what + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw DataError(path + ": fsync of " + what + " failed: " + std::strerror(err));
}

}  // namespace

struct Hdf5Writer::Impl {
  h5::Hid file, imgs, labels, a;
  std::vector<hsize_t> dims, a_dims;
};

Hdf5Writer::Hdf5Writer(std::string path, int64_t n, int64_t c, int64_t h, int64_t w, int64_t chunk_images,
                       int64_t a_channels)
    : impl_(std::make_unique<Impl>()), path_(std::move(path)), tmp_(path_ + ".tmp"), n_(n), row_bytes_(c * h * w),
      a_row_bytes_(a_channels * h * w) {
  if (n < 1 || c < 1 || h < 1 || w < 1 || a_channels < 0) {
    throw std::invalid_argument("Hdf5Writer: " + path_ + ": need n, c, h, w >= 1");
  }
  h5::quiet();
  const std::string in = tmp_ + " (for " + path_ + ")";
  impl_->file = h5::Hid(h5::check<DataError>(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                    "cannot create " + in + ": is the folder writable?"),
                         H5Fclose);
  impl_->dims = {static_cast<hsize_t>(n), static_cast<hsize_t>(c), static_cast<hsize_t>(h), static_cast<hsize_t>(w)};
  auto make = [&](const char* name, hid_t type, int rank, const hsize_t* dims, const hsize_t* chunk) {
    const std::string where = in + ": dataset '" + name + "'";
    h5::Hid space(h5::check<DataError>(H5Screate_simple(rank, dims, nullptr), where + ": cannot make its shape"), H5Sclose);
    h5::Hid dcpl(h5::check<DataError>(H5Pcreate(H5P_DATASET_CREATE), where + ": cannot make its properties"), H5Pclose);
    if (chunk) h5::check_status<DataError>(H5Pset_chunk(dcpl.get(), rank, chunk), where + ": cannot set its chunks");
    return h5::Hid(h5::check<DataError>(H5Dcreate2(impl_->file.get(), name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                               where + ": cannot create it"),
                    H5Dclose);
  };
  const int64_t ci = std::clamp<int64_t>(chunk_images, 1, n);
  const hsize_t img_chunk[4] = {static_cast<hsize_t>(ci), impl_->dims[1], impl_->dims[2], impl_->dims[3]};
  impl_->imgs = make(kImagesDataset, H5T_STD_U8LE, 4, impl_->dims.data(), chunk_images > 0 ? img_chunk : nullptr);
  const hsize_t ln = static_cast<hsize_t>(n), lab_chunk = static_cast<hsize_t>(std::min<int64_t>(n, 65536));
  impl_->labels = make(kLabelsDataset, H5T_STD_I64LE, 1, &ln, chunk_images > 0 ? &lab_chunk : nullptr);
  if (a_channels > 0) {  // pairs: A beside the images, which `B` names too
    impl_->a_dims = {impl_->dims[0], static_cast<hsize_t>(a_channels), impl_->dims[2], impl_->dims[3]};
    const hsize_t a_chunk[4] = {static_cast<hsize_t>(ci), impl_->a_dims[1], impl_->dims[2], impl_->dims[3]};
    impl_->a = make(kConditionDataset, H5T_STD_U8LE, 4, impl_->a_dims.data(), chunk_images > 0 ? a_chunk : nullptr);
    h5::check_status<DataError>(H5Lcreate_hard(impl_->file.get(), kImagesDataset, impl_->file.get(), kTargetDataset,
                                               H5P_DEFAULT, H5P_DEFAULT),
                                in + ": cannot link 'B' to 'imgs'");
  }
}

Hdf5Writer::~Hdf5Writer() {
  if (committed_) return;
  impl_.reset();  // closes the handles
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void Hdf5Writer::append(const uint8_t* images, const int64_t* labels, int64_t count, const uint8_t* a) {
  if (a_row_bytes_ > 0 && !a && count > 0) {
    throw std::invalid_argument("Hdf5Writer: " + path_ + ": a file of pairs needs the input images A of each append");
  }
  if (count < 0 || written_ + count > n_) {
    throw std::invalid_argument("Hdf5Writer: " + path_ + ": appending " + std::to_string(count) + " images after " +
                                std::to_string(written_) + " exceeds the " + std::to_string(n_) + " declared");
  }
  for (int64_t i = 0; i < count; ++i) {
    if (labels[i] < 0) {
      throw std::invalid_argument("Hdf5Writer: " + path_ + ": label of image " + std::to_string(written_ + i) + " is " +
                                  std::to_string(labels[i]) + ", negative");
    }
  }
  if (count == 0) return;
  h5::quiet();
  auto write = [&](const h5::Hid& ds, hid_t mem_type, const char* name, const void* data,
                   const std::vector<hsize_t>& dims) {
    const std::string where = tmp_ + ": dataset '" + name + "'";
    h5::Hid fspace(h5::check<DataError>(H5Dget_space(ds.get()), where + ": cannot read its shape"), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(fspace.get());
    std::vector<hsize_t> off(static_cast<size_t>(rank), 0), cnt(dims.begin(), dims.begin() + rank);
    off[0] = static_cast<hsize_t>(written_);
    cnt[0] = static_cast<hsize_t>(count);
    h5::check_status<DataError>(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr),
               where + ": cannot select rows");
    h5::Hid mspace(h5::check<DataError>(H5Screate_simple(rank, cnt.data(), nullptr), where + ": cannot make a memory space"),
                    H5Sclose);
    h5::check_status<DataError>(H5Dwrite(ds.get(), mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, data),
               where + ": writing rows [" + std::to_string(written_) + ", " + std::to_string(written_ + count) +
                   ") failed (disk full?)");
  };
  write(impl_->imgs, H5T_NATIVE_UINT8, kImagesDataset, images, impl_->dims);
  write(impl_->labels, H5T_NATIVE_INT64, kLabelsDataset, labels, impl_->dims);
  if (a_row_bytes_ > 0) write(impl_->a, H5T_NATIVE_UINT8, kConditionDataset, a, impl_->a_dims);
  written_ += count;
}

void Hdf5Writer::set_classes(const std::vector<std::string>& names) {
  if (names.empty()) return;
  h5::quiet();
  const std::string where = tmp_ + ": attribute 'classes' of '/'";
  h5::Hid type(h5::check<DataError>(H5Tcopy(H5T_C_S1), where + ": cannot make a string type"), H5Tclose);
  h5::check_status<DataError>(H5Tset_size(type.get(), H5T_VARIABLE), where + ": cannot make a string type");
  h5::check_status<DataError>(H5Tset_cset(type.get(), H5T_CSET_UTF8), where + ": cannot make a string type");
  const hsize_t k = names.size();
  h5::Hid space(h5::check<DataError>(H5Screate_simple(1, &k, nullptr), where + ": cannot make its shape"), H5Sclose);
  if (H5Aexists(impl_->file.get(), "classes") > 0) H5Adelete(impl_->file.get(), "classes");
  h5::Hid attr(h5::check<DataError>(H5Acreate2(impl_->file.get(), "classes", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                           where + ": cannot create it"),
                H5Aclose);
  std::vector<const char*> ptrs;
  for (const auto& s : names) ptrs.push_back(s.c_str());
  h5::check_status<DataError>(H5Awrite(attr.get(), type.get(), ptrs.data()), where + ": cannot write it");
}

void Hdf5Writer::commit() {
  if (written_ != n_) {
    throw std::logic_error("Hdf5Writer: " + path_ + ": " + std::to_string(written_) + " of " + std::to_string(n_) +
                           " images written at commit");
  }
  h5::quiet();
  h5::check_status<DataError>(H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL), tmp_ + ": flushing failed (disk full?)");
  impl_->imgs.reset();
  impl_->labels.reset();
  impl_->a.reset();
  h5::check_status<DataError>(impl_->file.reset(), tmp_ + ": closing failed (disk full?)");
  fsync_or_throw(tmp_, "the new file");
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) throw DataError("cannot rename " + tmp_ + " to " + path_ + ": " + ec.message());
  const fs::path parent = fs::absolute(path_).parent_path();
  fsync_or_throw(parent.string(), "the folder (for the rename)");
  committed_ = true;
}

ConvertResult convert_fashion_mnist(const std::string& dir, const std::string& split, const std::string& out,
                                    int64_t chunk_images, bool edge_pairs) {
  // load_fashion_mnist validates the idx files and pads; its float32 values b / 127.5 - 1
  // map back to the bytes b exactly ((v + 1) * 127.5 is within 1e-4 of b), and scaling
  // those bytes again must give its values bit for bit (checked below).
  const at::Tensor ref = load_fashion_mnist(dir, at::kFloat, split);
  const at::Tensor labels = load_fashion_mnist_labels(dir, split);
  const at::Tensor bytes = ref.add(1.0).mul_(127.5).round_().clamp_(0, 255).to(at::kByte).contiguous();
  if (!torch::equal(scale_pixels(bytes, at::kFloat), ref)) {
    throw std::logic_error("convert_fashion_mnist: the bytes do not reproduce load_fashion_mnist's values");
  }
  if (labels.size(0) != bytes.size(0)) {
    throw DataError(dir + ": " + split + " has " + std::to_string(bytes.size(0)) + " images but " +
                    std::to_string(labels.size(0)) + " labels");
  }
  const int64_t n = bytes.size(0);
  // Pairs: the edge map's -1 / 1 as bytes 0 / 255 (scale_pixels maps them back exactly).
  const at::Tensor a = edge_pairs ? sobel_edges(ref).add_(1.0).mul_(127.5).to(at::kByte).contiguous() : at::Tensor();
  Hdf5Writer w(out, n, bytes.size(1), bytes.size(2), bytes.size(3), chunk_images, edge_pairs ? a.size(1) : 0);
  const int64_t step = 4096;
  for (int64_t s = 0; s < n; s += step) {
    const int64_t k = std::min(step, n - s);
    w.append(bytes.data_ptr<uint8_t>() + s * bytes[0].numel(), labels.data_ptr<int64_t>() + s, k,
             edge_pairs ? a.data_ptr<uint8_t>() + s * a[0].numel() : nullptr);
  }
  w.set_classes(kFashionMnistClassNames);
  w.commit();
  return {n, bytes.size(1), bytes.size(2), bytes.size(3), kFashionMnistClassNames, 0};
}

bool is_image_file(const fs::path& p) {
  static const std::set<std::string> kExt = {".png", ".jpg", ".jpeg", ".bmp", ".pgm", ".ppm", ".tga"};
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return kExt.count(e) > 0;
}

namespace {

// Python's round(d / 2) for d >= 0 (halves to even), as torchvision's center_crop computes offsets.
int64_t half_round_even(int64_t d) {
  const int64_t k = d / 2;
  return (d % 2 == 1 && k % 2 == 1) ? k + 1 : k;
}

}  // namespace

DecodedImage decode_image(const std::string& file, int64_t channels) {
  int w = 0, h = 0, comp = 0;
  // stb_image 2.27, asked for another channel count than a 16-bit PNM or PNG holds,
  // converts it with its 8-bit routine and then reads past the result (a heap over-read
  // that paired_folder_fuzz found). A 16-bit file is decoded only into its own channel count.
  if (stbi_is_16_bit(file.c_str()) && stbi_info(file.c_str(), &w, &h, &comp) && comp != channels) {
    throw DataError(file + ": a 16-bit image with " + std::to_string(comp) + " channels; stb_image cannot convert it to " +
                    std::to_string(channels) + " safely: save it with 8 bits per channel (or with " +
                    std::to_string(channels) + " channels)");
  }
  DecodedImage d{{stbi_load(file.c_str(), &w, &h, &comp, static_cast<int>(channels)), stbi_image_free}, w, h};
  if (!d.pixels) {
    const char* why = stbi_failure_reason();
    throw DataError(file + ": cannot decode the image (" + std::string(why ? why : "unknown reason") + ")");
  }
  // stb_image decodes a PNM header of height or width 0 into an empty image; resizing it
  // would fail an assertion inside stb_image_resize and abort (found by paired_folder_fuzz).
  if (w < 1 || h < 1) {
    throw DataError(file + ": cannot decode the image (its header gives " + std::to_string(w) + "x" +
                    std::to_string(h) + " pixels)");
  }
  return d;
}

void resize_to_chw(const uint8_t* src, int64_t w, int64_t h, int64_t stride, int64_t channels, int64_t size,
                   uint8_t* dst, const std::string& file) {
  std::vector<uint8_t> hwc(static_cast<size_t>(size * size * channels));
  if (w == size && h == size) {
    for (int64_t y = 0; y < size; ++y) std::memcpy(&hwc[y * size * channels], src + y * stride, size * channels);
  } else if (!stbir_resize_uint8(src, static_cast<int>(w), static_cast<int>(h), static_cast<int>(stride), hwc.data(),
                                 static_cast<int>(size), static_cast<int>(size), 0, static_cast<int>(channels))) {
    throw DataError(file + ": resizing from " + std::to_string(w) + "x" + std::to_string(h) + " to " +
                    std::to_string(size) + "x" + std::to_string(size) + " failed");
  }
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t i = 0; i < size * size; ++i) dst[c * size * size + i] = hwc[i * channels + c];
  }
}

namespace {

// Decodes `file` into `channels`, centre-crops to a square and resizes to size x size;
// writes [channels, size, size] to `dst`.
void load_image(const std::string& file, int64_t size, int64_t channels, uint8_t* dst) {
  const DecodedImage d = decode_image(file, channels);
  const int64_t w = d.width, m = std::min(d.width, d.height), x0 = half_round_even(w - m),
                y0 = half_round_even(d.height - m);
  resize_to_chw(d.pixels.get() + (y0 * w + x0) * channels, m, m, w * channels, channels, size, dst, file);
}

}  // namespace

ConvertResult convert_image_folder(const std::string& dir, const std::string& out, int64_t size, int64_t channels,
                                   int64_t chunk_images) {
  if (size < 1 || size > 4096) throw std::invalid_argument("--size must be 1 to 4096, got " + std::to_string(size));
  if (channels != 1 && channels != 3) {
    throw std::invalid_argument("--channels must be 1 (grey) or 3 (RGB), got " + std::to_string(channels));
  }
  if (!fs::is_directory(dir)) throw DataError(dir + ": no such folder");
  ConvertResult r;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) r.classes.push_back(e.path().filename().string());
  }
  std::sort(r.classes.begin(), r.classes.end());
  if (r.classes.empty()) {
    throw DataError(dir + ": no class folders: an ImageFolder holds one subfolder per class (" + dir +
                    "/<class>/<image>.png)");
  }
  // (file, label) in torchvision's order: classes sorted, then sorted(os.walk) roots, then
  // sorted file names in each root.
  std::vector<std::pair<std::string, int64_t>> files;
  for (size_t k = 0; k < r.classes.size(); ++k) {
    std::vector<std::pair<std::string, std::string>> found;  // (folder, name)
    for (const auto& e : fs::recursive_directory_iterator(fs::path(dir) / r.classes[k],
                                                          fs::directory_options::follow_directory_symlink)) {
      if (!e.is_regular_file()) continue;
      if (is_image_file(e.path())) {
        found.emplace_back(e.path().parent_path().string(), e.path().filename().string());
      } else {
        ++r.skipped_files;
      }
    }
    if (found.empty()) {
      throw DataError((fs::path(dir) / r.classes[k]).string() + ": class folder '" + r.classes[k] +
                      "' holds no image (.png, .jpg, .jpeg, .bmp, .pgm, .ppm, .tga)");
    }
    std::sort(found.begin(), found.end());
    for (auto& [folder, name] : found) files.emplace_back((fs::path(folder) / name).string(), static_cast<int64_t>(k));
  }
  r.images = static_cast<int64_t>(files.size());
  r.channels = channels;
  r.height = r.width = size;
  Hdf5Writer w(out, r.images, channels, size, size, chunk_images);
  const int64_t row = channels * size * size, batch = 256;
  std::vector<uint8_t> buf(static_cast<size_t>(batch * row));
  std::vector<int64_t> lab(static_cast<size_t>(batch));
  for (int64_t s = 0; s < r.images; s += batch) {
    const int64_t k = std::min(batch, r.images - s);
    for (int64_t i = 0; i < k; ++i) {
      load_image(files[s + i].first, size, channels, buf.data() + i * row);
      lab[i] = files[s + i].second;
    }
    w.append(buf.data(), lab.data(), k);
  }
  w.set_classes(r.classes);
  w.commit();
  return r;
}

}  // namespace shardgan::data
