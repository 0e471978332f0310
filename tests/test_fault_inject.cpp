// The disk tier's I/O under injected faults (issue 22): DirectFile with the process-wide
// IoFaultPlan (direct_file.h) returning short transfers, EAGAIN, EIO, ENOSPC and EINVAL at
// chosen completions, and failing io_uring_submit at chosen calls. Every case ends in the
// right data (a retry) or an OffloadError naming the path and offset, never a hang or
// wrong data; the file stays usable afterwards and its destructor returns.
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shardgan/offload/direct_file.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kBlock = 1 << 20;  // bytes per request
constexpr int kBlocks = 4;

struct Aligned {
  explicit Aligned(int64_t n) : bytes(n) {
    void* p = nullptr;
    if (posix_memalign(&p, DirectFile::kAlign, static_cast<size_t>(n)) != 0) throw std::bad_alloc();
    data.reset(static_cast<char*>(p));
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data;
  int64_t bytes;
};

class FaultInject : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/shardgan-fault.XXXXXX";
    dir_ = ::mkdtemp(t);
    path_ = dir_ + "/f.offload";
    src_ = std::make_unique<Aligned>(kBlock * kBlocks);
    for (int64_t i = 0; i < src_->bytes; ++i) src_->data.get()[i] = static_cast<char>((i * 131 + i / 4096) & 0xff);
  }
  void TearDown() override {
    set_io_faults({});
    fs::remove_all(dir_);
  }
  // Writes src_ block by block, then reads it back into a fresh buffer; true if equal.
  bool round_trip(DirectFile& f) {
    std::vector<uint64_t> t;
    for (int b = 0; b < kBlocks; ++b) t.push_back(f.submit_write(b * kBlock, src_->data.get() + b * kBlock, kBlock));
    for (uint64_t x : t) f.wait(x);
    Aligned back(kBlock * kBlocks);
    std::memset(back.data.get(), 0, static_cast<size_t>(back.bytes));
    t.clear();
    for (int b = 0; b < kBlocks; ++b) t.push_back(f.submit_read(b * kBlock, back.data.get() + b * kBlock, kBlock));
    f.wait_all();
    return std::memcmp(back.data.get(), src_->data.get(), static_cast<size_t>(back.bytes)) == 0;
  }
  std::string dir_, path_;
  std::unique_ptr<Aligned> src_;
};

TEST_F(FaultInject, ShortTransfersAndEagainAreRetriedWithTheRightData) {
  // Completions 0-7: the four writes, then the four reads (plus their resubmissions, which
  // shift later indices: every other completion gets a fault).
  set_io_faults(parse_io_faults("c0=short,c1=eagain,c3=short,c5=eagain,c6=short,c8=short,c10=eagain,c11=short"));
  DirectFile f(path_, kBlock * kBlocks, 4);
  EXPECT_TRUE(round_trip(f));
  EXPECT_EQ(f.bytes_written(), kBlock * kBlocks) << "a partial block counted twice or not at all";
  EXPECT_EQ(f.bytes_read(), kBlock * kBlocks);
}

TEST_F(FaultInject, EioOnReadNamesPathAndOffsetAndTheFileStaysUsable) {
  DirectFile f(path_, kBlock * kBlocks, 4);
  ASSERT_TRUE(round_trip(f));
  set_io_faults(parse_io_faults("c0=eio"));
  Aligned buf(kBlock);
  const uint64_t t = f.submit_read(2 * kBlock, buf.data.get(), kBlock);
  try {
    f.wait(t);
    FAIL() << "no error for an EIO";
  } catch (const OffloadError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(path_), std::string::npos) << w;
    EXPECT_NE(w.find("read at byte " + std::to_string(2 * kBlock)), std::string::npos) << w;
    EXPECT_NE(w.find("errno 5"), std::string::npos) << w;
  }
  EXPECT_TRUE(round_trip(f)) << "the file is unusable after a failed request";
}

TEST_F(FaultInject, EnospcOnWriteSaysTheDiskIsFull) {
  set_io_faults(parse_io_faults("c1=enospc"));
  DirectFile f(path_, kBlock * kBlocks, 4);
  std::vector<uint64_t> t;
  for (int b = 0; b < 2; ++b) t.push_back(f.submit_write(b * kBlock, src_->data.get() + b * kBlock, kBlock));
  f.wait(t[0]);
  try {
    f.wait(t[1]);
    FAIL() << "no error for ENOSPC";
  } catch (const OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("disk is full"), std::string::npos) << e.what();
  }
}

TEST_F(FaultInject, TransientSubmitFailuresAreRetried) {
  set_io_faults(parse_io_faults("s0=ebusy,s1=ebusy,s3=ebusy"));
  DirectFile f(path_, kBlock * kBlocks, 4);
  EXPECT_TRUE(round_trip(f));
}

// A fatal io_uring_submit error: the request is reported failed, the entry it queued is
// accounted for (its completion, when a later submit sends it, finds no waiter and is
// dropped), later requests work, and the destructor returns at once. Before the fix the
// stray completion found no ticket and the unsigned in-flight count underflowed, so the
// next wait never returned.
TEST_F(FaultInject, FatalSubmitFailureIsReportedAndNothingHangs) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    set_io_faults(parse_io_faults("s0=eio"));
    DirectFile f(path_, kBlock * kBlocks, 4);
    try {
      f.submit_write(0, src_->data.get(), kBlock);
      FAIL() << "no error for a failed submit";
    } catch (const OffloadError& e) {
      EXPECT_NE(std::string(e.what()).find("io_uring_submit (write)"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(round_trip(f));
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_FALSE(fs::exists(path_));
}

// A short transfer whose resubmission fails: its waiter gets the error (the ticket used
// to be lost, and wait() threw "unknown request").
TEST_F(FaultInject, FailedResubmissionKeepsItsTicket) {
  set_io_faults(parse_io_faults("c0=short,s1=eio"));
  DirectFile f(path_, kBlock * kBlocks, 4);
  const uint64_t t = f.submit_write(0, src_->data.get(), kBlock);
  try {
    f.wait(t);
    FAIL() << "no error for the failed resubmission";
  } catch (const OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
  EXPECT_TRUE(round_trip(f));
}

// A filesystem that accepts O_DIRECT at open but refuses it on I/O (EINVAL): the file
// switches to buffered I/O and the request is retried.
TEST_F(FaultInject, EinvalOnIoFallsBackToBufferedIo) {
  DirectFile f(path_, kBlock * kBlocks, 4);
  if (!f.direct()) GTEST_SKIP() << "this filesystem refuses O_DIRECT at open: the I/O fallback is not exercised";
  set_io_faults(parse_io_faults("c0=einval"));
  EXPECT_TRUE(round_trip(f));
  EXPECT_FALSE(f.direct());
}

TEST(FaultPlan, BadItemsAreRefusedNamingThem) {
  EXPECT_THROW(parse_io_faults("c1=boom"), std::invalid_argument);
  EXPECT_THROW(parse_io_faults("x1=eio"), std::invalid_argument);
  EXPECT_THROW(parse_io_faults("s1=short"), std::invalid_argument);
  EXPECT_EQ(parse_io_faults("c1=eio,s2=ebusy").completion.at(1), "eio");
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
