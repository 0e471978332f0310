#include "shardgan/offload/state_store.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <stdexcept>
#include <system_error>

#include "shardgan/offload/direct_file.h"
#include "shardgan/offload/host_memory.h"

namespace shardgan {

namespace fs = std::filesystem;

namespace {
constexpr int64_t kAlign = DirectFile::kAlign;
int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

struct OffloadStore::HostArray {
  explicit HostArray(int64_t bytes) : p(static_cast<char*>(host_alloc(bytes))), bytes(bytes) {}
  ~HostArray() { host_free(p); }
  char* p;
  int64_t bytes;
};

namespace {
std::vector<int64_t> repeat(int64_t bytes, int n) { return std::vector<int64_t>(static_cast<size_t>(std::max(0, n)), bytes); }
}  // namespace

OffloadStore::OffloadStore(OffloadDevice device, const OffloadConfig& cfg, const std::string& stem,
                           std::vector<int64_t> unit_numel, int arrays, int scratch_arrays, int64_t elem_bytes)
    : OffloadStore(device, cfg, stem, std::move(unit_numel), repeat(elem_bytes, arrays), repeat(elem_bytes, scratch_arrays)) {}

OffloadStore::OffloadStore(OffloadDevice device, const OffloadConfig& cfg, const std::string& stem,
                           std::vector<int64_t> unit_numel, std::vector<int64_t> array_bytes,
                           std::vector<int64_t> scratch_bytes, int64_t chunk_multiple)
    : device_(device), numel_(std::move(unit_numel)), arrays_(static_cast<int>(array_bytes.size())),
      scratch_(static_cast<int>(scratch_bytes.size())), buffer_bytes_(cfg.buffer_bytes),
      buffer_count_(cfg.buffer_count) {
  if (device_ == OffloadDevice::kNone) throw std::invalid_argument("OffloadStore: device none has no store");
  elem_ = std::move(array_bytes);
  elem_.insert(elem_.end(), scratch_bytes.begin(), scratch_bytes.end());
  bool bad = arrays_ < 1 || chunk_multiple < 1;
  for (int64_t e : elem_) bad |= e < 1 || kAlign % e != 0;
  if (bad) {
    throw std::invalid_argument("OffloadStore: bad layout (" + std::to_string(arrays_) + " arrays, chunk multiple " +
                                std::to_string(chunk_multiple) + ", element sizes must divide 4096)");
  }
  if (buffer_count_ < 2) throw std::invalid_argument("offload.buffer_count must be >= 2");
  // The cpu tier's arrays stay where they are, so its ring holds only the staging
  // (scratch) slices, and a buffer of the same bytes gives longer chunks.
  // (None at all when nothing is staged: the chunks then only cut the host arrays.)
  if (device_ == OffloadDevice::kCpu) ring_first_ = arrays_;
  ring_slices_ = arrays_ + scratch_ - ring_first_;
  // A chunk's elements: a multiple of chunk_multiple and of 4096 / gcd(4096, e) for every
  // slice, so that each slice (and each file offset) is a whole number of 4096-byte blocks.
  int64_t quantum = chunk_multiple, per_element = 0;
  for (int i = ring_first_; i < arrays_ + scratch_; ++i) {
    quantum = std::lcm(quantum, kAlign / std::gcd(kAlign, elem_[i]));
    per_element += elem_[i];
  }
  for (int i = 0; i < ring_first_; ++i) quantum = std::lcm(quantum, kAlign / std::gcd(kAlign, elem_[i]));
  chunk_numel_ = per_element == 0 ? quantum * std::max<int64_t>(1, buffer_bytes_ / kAlign)
                                  : buffer_bytes_ / per_element / quantum * quantum;
  if (chunk_numel_ < 1) {
    throw std::invalid_argument("offload.buffer_bytes " + std::to_string(buffer_bytes_) + " is too small: it needs " +
                                std::to_string(per_element * quantum) + " bytes or more");
  }
  // No chunk is longer than the largest unit (rounded up to whole quanta), so a small
  // model does not pay for a large ring.
  int64_t largest = 1;
  for (int64_t n : numel_) largest = std::max(largest, n);
  chunk_numel_ = std::min(chunk_numel_, (largest + quantum - 1) / quantum * quantum);
  // The cpu tier streams from memory: one staging buffer is enough, nothing to overlap.
  if (device_ == OffloadDevice::kCpu) buffer_count_ = 1;
  for (int i = ring_first_; i < arrays_ + scratch_; ++i) {
    slice_off_.push_back(ring_stride_);
    ring_stride_ += chunk_numel_ * elem_[i];
  }
  if (ring_slices_ > 0) ring_ = std::make_unique<HostArray>(buffer_count_ * ring_stride_);
  if (device_ == OffloadDevice::kCpu) {
    for (int64_t n : numel_) {
      for (int a = 0; a < arrays_; ++a) host_.push_back(std::make_unique<HostArray>(n * elem_[a]));
    }
    return;
  }
  int64_t off = 0;
  for (int64_t n : numel_) {
    for (int a = 0; a < arrays_; ++a) {
      region_.push_back(off);
      off += align_up(n * elem_[a]);
    }
  }
  const fs::path dir(cfg.path);
  std::error_code ec;
  if (cfg.path.empty() || !fs::is_directory(dir, ec)) {
    throw OffloadError("offload.path '" + cfg.path + "' does not exist or is not a folder: create it, or point "
                       "offload.path at a folder on a local disk");
  }
  file_ = std::make_unique<DirectFile>((dir / (stem + ".offload")).string(), off,
                                       static_cast<int>(cfg.queue_depth));
}

OffloadStore::~OffloadStore() = default;

void OffloadStore::stream(const std::vector<size_t>& units, Mode mode,
                          const std::function<void(const Chunk&)>& fn, uint32_t arrays, uint32_t written) {
  auto used = [&](int a) { return ((arrays >> a) & 1u) != 0; };
  auto write_back = [&](int a) { return used(a) && ((written >> a) & 1u) != 0; };
  struct Piece {
    size_t unit;
    int64_t offset, numel;
  };
  std::vector<Piece> pieces;
  for (size_t u : units) {
    for (int64_t o = 0; o < numel_.at(u); o += chunk_numel_) pieces.push_back({u, o, std::min(chunk_numel_, numel_[u] - o)});
  }
  auto slot_ptr = [&](size_t piece, int s) {
    return ring_->p + static_cast<int64_t>(piece % buffer_count_) * ring_stride_ + slice_off_[s - ring_first_];
  };
  Chunk c;
  c.data.resize(arrays_);
  c.scratch.resize(scratch_);
  // Hands piece j to fn, with array a's elements at data(a); staging is always in the ring.
  auto run = [&](size_t j, const auto& data) {
    const Piece& p = pieces[j];
    c.unit = p.unit;
    c.offset = p.offset;
    c.numel = p.numel;
    for (int a = 0; a < arrays_; ++a) c.data[a] = used(a) ? data(a) : nullptr;
    for (int s = 0; s < scratch_; ++s) c.scratch[s] = slot_ptr(j, arrays_ + s);
    fn(c);
  };
  if (device_ == OffloadDevice::kCpu) {
    for (size_t j = 0; j < pieces.size(); ++j) {
      const Piece& p = pieces[j];
      run(j, [&](int a) { return host_[p.unit * arrays_ + a]->p + p.offset * elem_[a]; });
    }
    return;
  }
  const size_t n = pieces.size();
  const size_t count = static_cast<size_t>(buffer_count_);
  std::vector<std::vector<uint64_t>> reads(count), writes(count);  // tickets per slot
  auto file_off = [&](const Piece& p, int a) { return region_[p.unit * arrays_ + a] + p.offset * elem_[a]; };
  auto wait_tickets = [&](std::vector<uint64_t>& t) {
    for (uint64_t x : t) file_->wait(x);
    t.clear();
  };
  size_t next_read = 0;
  // With write-back, the slot of piece j + count - 1 is still being written (piece j - 1),
  // so reads run up to count - 2 pieces ahead; without it, count - 1.
  const size_t ahead = mode == Mode::kRead ? count - 1 : count - 2;
  try {
    for (size_t j = 0; j < n; ++j) {
      if (mode != Mode::kWrite) {
        for (; next_read < n && next_read <= j + ahead; ++next_read) {
          const size_t slot = next_read % count;
          wait_tickets(writes[slot]);
          const Piece& p = pieces[next_read];
          for (int a = 0; a < arrays_; ++a) {
            if (!used(a)) continue;
            reads[slot].push_back(file_->submit_read(file_off(p, a), slot_ptr(next_read, a), align_up(p.numel * elem_[a])));
          }
        }
        wait_tickets(reads[j % count]);
      } else {
        wait_tickets(writes[j % count]);
      }
      const Piece& p = pieces[j];
      run(j, [&](int a) { return slot_ptr(j, a); });
      if (mode != Mode::kRead) {
        for (int a = 0; a < arrays_; ++a) {
          if (!write_back(a)) continue;
          writes[j % count].push_back(file_->submit_write(file_off(p, a), slot_ptr(j, a), align_up(p.numel * elem_[a])));
        }
      }
    }
    file_->wait_all();
  } catch (...) {
    // Never leave a request writing into (or reading from) the ring after we return.
    try {
      file_->wait_all();
    } catch (...) {
    }
    throw;
  }
}

void* OffloadStore::host_array(size_t unit, int a) const {
  if (device_ != OffloadDevice::kCpu) throw std::logic_error("OffloadStore::host_array: the disk tier has no host arrays");
  if (unit >= numel_.size() || a < 0 || a >= arrays_) throw std::out_of_range("OffloadStore::host_array: no such array");
  return host_[unit * arrays_ + a]->p;
}

void* OffloadStore::staging(int s) const {
  if (device_ != OffloadDevice::kCpu) throw std::logic_error("OffloadStore::staging: only the cpu tier lends its ring");
  if (s < 0 || s >= scratch_) throw std::out_of_range("OffloadStore::staging: no such slice");
  return ring_->p + slice_off_[arrays_ + s - ring_first_];
}

int64_t OffloadStore::ram_bytes() const {
  int64_t b = ring_ ? ring_->bytes : 0;
  for (const auto& h : host_) b += h->bytes;
  return b;
}

int64_t OffloadStore::disk_bytes() const { return file_ ? file_->size_bytes() : 0; }

int64_t OffloadStore::state_bytes() const {
  int64_t b = 0;
  for (int64_t n : numel_) {
    for (int a = 0; a < arrays_; ++a) b += n * elem_[a];
  }
  return b;
}

bool OffloadStore::direct() const { return file_ ? file_->direct() : false; }
std::string OffloadStore::path() const { return file_ ? file_->path() : std::string(); }
int64_t OffloadStore::bytes_read() const { return file_ ? file_->bytes_read() : 0; }
int64_t OffloadStore::bytes_written() const { return file_ ? file_->bytes_written() : 0; }

}  // namespace shardgan
