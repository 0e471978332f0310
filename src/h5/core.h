#pragma once
// The base of shardgan's HDF5 layer (private to src/): an owning handle, error checks that
// throw the caller's exception type with HDF5's own error stack appended, and a readable
// name for a stored element type. src/h5/h5.cpp (the File API of checkpoints and the FID
// classifier) and src/data (the dataset reader and converter) are both built on it.
// The HDF5 library is thread-safe (Debian builds it so); its error stack and auto-printing
// are per thread, so every entry point calls quiet().
#include <string>

#include <hdf5.h>

namespace shardgan::h5 {

/// Stops HDF5 from printing its error stack to stderr in the calling thread (we put it
/// into the exception instead).
void quiet();

/// "; HDF5 says:\n  #0 func: desc..." for this thread's error stack (empty if there is
/// none), and clears the stack.
std::string take_error_stack();

/// Throws E(`what` + take_error_stack()).
template <class E>
[[noreturn]] void fail(const std::string& what) {
  throw E(what + take_error_stack());
}

/// Returns `id`; fail<E>(what) when it is negative (an HDF5 call that failed).
template <class E>
hid_t check(hid_t id, const std::string& what) {
  if (id < 0) fail<E>(what);
  return id;
}

/// For the status of an HDF5 call (herr_t): fail<E>(what) when it is negative.
template <class E>
void check_status(herr_t st, const std::string& what) {
  if (st < 0) fail<E>(what);
}

/// Owns one hid_t and closes it with `closer` (H5Fclose, H5Dclose, ...).
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  Hid(Hid&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = -1;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }
  hid_t get() const { return id_; }
  /// Gives up ownership: returns the id, which the caller must close.
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  /// Closes now; returns the closer's status (negative on failure), 0 if nothing was open.
  herr_t reset() {
    herr_t st = 0;
    if (id_ >= 0 && closer_) st = closer_(id_);
    id_ = -1;
    return st;
  }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

/// "uint8", "int64", "float32", "string", ... for a stored type (from its class, size and sign).
std::string type_name(hid_t type);

}  // namespace shardgan::h5
