#pragma once
// The checks of shardgan's own HDF5 API (src/h5/h5.cpp, src/h5/probe.cpp): core.h's check
// and check_status with H5Error, the exception that API throws.
#include <string>

#include <hdf5.h>

#include "h5/core.h"
#include "shardgan/h5/h5.h"

namespace shardgan::h5 {

/// Returns `id`; throws H5Error(what + HDF5's error stack) when it is negative.
inline hid_t check(hid_t id, const std::string& what) { return check<H5Error>(id, what); }
/// Throws H5Error(what + HDF5's error stack) when `st` is negative.
inline void check_status(herr_t st, const std::string& what) { check_status<H5Error>(st, what); }

}  // namespace shardgan::h5
