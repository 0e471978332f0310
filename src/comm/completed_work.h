#pragma once
// A handle of a collective that finished before it was returned (private to src/comm): the
// blocking defaults of Communicator's *_async methods and the backends without transfers.
#include "shardgan/comm/communicator.h"

namespace shardgan::detail {

struct CompletedWork final : Work {
  void wait() override {}
};

}  // namespace shardgan::detail
