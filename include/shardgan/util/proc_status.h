#pragma once
/// One field of /proc/self/status in bytes: VmRSS (resident now) or VmHWM (peak resident),
/// which the kernel gives in kB. -1 when the file or the field cannot be read. Local.
#include <cstdint>

namespace shardgan {

int64_t proc_status_bytes(const char* field);

}  // namespace shardgan
