#pragma once
/// Test-only switches for negative controls: a ctest entry sets SHARDGAN_TEST_CONTROL to a
/// comma-separated list of control names, and the code under test deliberately breaks the
/// named invariant, so that the test shows it would catch the break. Never set in
/// production; every use names its control in a comment beside the call.
#include <string_view>

namespace shardgan {

/// Whether the control `name` is listed in SHARDGAN_TEST_CONTROL (read once per process,
/// at the first call; thread-safe). Local, no allocation after the first call.
bool test_control(std::string_view name);

}  // namespace shardgan
