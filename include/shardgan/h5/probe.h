#pragma once
/// Probing an HDF5 file in a forked child before a reader opens it in-process.
/// Debian's HDF5 1.10 is not hardened against crafted or corrupted files: some crash it
/// (SIGSEGV in H5D__select_read, heap over-reads under H5O__msg_iterate_real) and some make
/// it spin for minutes (H5C_protect, H5S_select_hyperslab on a crafted virtual dataset);
/// tests/fuzz/library_crashes/README.md lists the files found so far. A reader of user
/// input (the image dataset, the FID classifier, a checkpoint's index and rank files) first
/// has a child do the HDF5 work the reader will do (see probe_read), under a deadline, so
/// that such a file becomes an error naming it instead of a dead or hung rank. Reads
/// through HDF5's public C API only; never a collective.
#include <string>
#include <vector>

namespace shardgan::h5 {

/// The probe's default deadline, in seconds: generous for a file on slow network storage
/// (the probe reads metadata and at most kProbeFullReadBytes per named dataset). The
/// environment variable SHARDGAN_HDF5_PROBE_DEADLINE_S (seconds, > 0) replaces it.
constexpr double kProbeDeadlineS = 120;
/// A named dataset of at most this many bytes is read whole by the probe; a larger one,
/// its first and last rows along dimension 0 (or first and last elements, when a row is
/// larger than this).
constexpr long long kProbeFullReadBytes = 16ll << 20;

/// The probe's deadline in seconds: SHARDGAN_HDF5_PROBE_DEADLINE_S when set to a number
/// > 0, else kProbeDeadlineS. Throws std::invalid_argument naming the variable when it is
/// set to anything else.
double probe_deadline_s();

/// The child's work, done in this process: opens `path` read-only, visits every object
/// with all of its header information (what h5py's visititems does), reads every
/// attribute of an integer, float or string type (up to kProbeFullReadBytes each), decodes
/// every dataset's type, dataspace and creation properties (layout, chunking, filters,
/// virtual mappings, without reading a virtual dataset's sources), and reads each dataset
/// of `datasets` ("imgs", "a/b/c"; "*" names every dataset) that exists, as
/// kProbeFullReadBytes says. Throws
/// H5Error naming the file and the object, with HDF5's error stack. Not isolated: the
/// fuzz targets and probe_isolated call it.
void probe_read(const std::string& path, const std::vector<std::string>& datasets);

/// probe_read(path, datasets) in a forked child (util/isolate.h) that is killed after
/// `deadline_s` seconds (probe_deadline_s() when < 0). Returns "" when the child read the
/// file cleanly, else one line saying why not, to follow the file's name: HDF5's error
/// ("an object header cannot be decoded; HDF5 says: ..."), "the HDF5 library crashed
/// (signal 11, Segmentation fault) reading its metadata: the file is corrupted or crafted"
/// or "reading its HDF5 metadata did not finish within 120 s (...)". A file that read
/// cleanly is remembered for the life of the process (by path, size and modification
/// time) and not probed again. Call it where no other thread of the process is inside
/// HDF5 (shardgan calls it at start-up): the child has only the calling thread, and an
/// HDF5 lock held by another thread at fork() would stay held there until the deadline.
/// Thread-safe; throws std::invalid_argument only for a bad SHARDGAN_HDF5_PROBE_DEADLINE_S.
std::string probe_isolated(const std::string& path, const std::vector<std::string>& datasets,
                           double deadline_s = -1);

/// Turns probe_isolated on (the default) or off for the whole process; off, it returns ""
/// without reading the file. Only for the libFuzzer targets (tests/fuzz/), which must run
/// a reader's own HDF5 calls in-process to see their coverage and crashes; shardgan itself
/// never turns it off. Thread-safe.
void set_probing(bool on);

}  // namespace shardgan::h5
