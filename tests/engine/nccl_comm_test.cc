// The NCCL backend against a CPU reference: one communicator rank per visible GPU, each on its
// own thread (NCCL's init is collective). Skipped, with a message, without NCCL or a GPU.
#include "engine_min/nccl_comm.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

using namespace engine_min;

namespace {

float Value(int rank, size_t i) { return static_cast<float>((rank + 1) * 0.25 + (i % 13) * 0.5); }
// Large and negative, so a sum that lost a bit (or wrapped at 32 bits) would show.
int64_t IntValue(int rank, size_t i) {
  return (int64_t{1} << 52) + static_cast<int64_t>(i) * 7919 - (rank + 1) * 1000003;
}

struct RankResult {
  ckpt::Status status;
  std::vector<float> reduce_scattered, all_reduced;
  std::vector<int64_t> int_reduce_scattered, int_all_reduced;
  std::vector<uint8_t> gathered, broadcast;
};

}  // namespace

TEST_CASE("NCCL backend: reduce-scatter, all-gather, all-reduce (float, int64), broadcast",
          "[cuda]") {
  if (!NcclAvailable()) {
    WARN("skipped: engine_min was built without CUDA/NCCL");
    return;
  }
  const int world = CudaDeviceCount();
  if (world == 0) {
    WARN("skipped: no CUDA device visible (the NCCL backend needs a GPU)");
    return;
  }
  auto id = NcclNewUniqueId();
  REQUIRE(id.ok());
  const size_t count = 1000;  // per rank
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankResult& out = results[r];
      auto comm = CreateNcclComm(*id, r, world, r);
      if (!comm.ok()) {
        out.status = comm.status();
        return;
      }
      DataParallelComm& c = **comm;
      std::vector<float> in(count * world);
      for (size_t i = 0; i < in.size(); ++i) in[i] = Value(r, i);
      out.reduce_scattered.resize(count);
      ckpt::Status s = c.ReduceScatterSum(in.data(), out.reduce_scattered.data(), count);
      if (s.ok()) {
        out.all_reduced = in;
        s = c.AllReduceSum(out.all_reduced.data(), out.all_reduced.size());
      }
      std::vector<uint8_t> mine(37, static_cast<uint8_t>(r + 1));
      out.gathered.resize(mine.size() * world);
      if (s.ok()) s = c.AllGather(mine.data(), out.gathered.data(), mine.size());
      std::vector<int64_t> ints(count * world);
      for (size_t i = 0; i < ints.size(); ++i) ints[i] = IntValue(r, i);
      out.int_reduce_scattered.resize(count);
      if (s.ok()) s = c.ReduceScatterSumInt64(ints.data(), out.int_reduce_scattered.data(), count);
      out.int_all_reduced = ints;
      if (s.ok()) s = c.AllReduceSumInt64(out.int_all_reduced.data(), ints.size());
      out.broadcast.assign(64, static_cast<uint8_t>(r == 0 ? 0xab : 0));
      if (s.ok()) s = c.Broadcast(out.broadcast.data(), out.broadcast.size(), 0);
      out.status = s;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(results[r].status.ok());
    for (size_t i = 0; i < count; ++i) {
      float expect = 0;
      for (int q = 0; q < world; ++q) expect += Value(q, r * count + i);
      REQUIRE(results[r].reduce_scattered[i] == Approx(expect).epsilon(1e-6));
    }
    for (size_t i = 0; i < count * world; ++i) {
      float expect = 0;
      for (int q = 0; q < world; ++q) expect += Value(q, i);
      REQUIRE(results[r].all_reduced[i] == Approx(expect).epsilon(1e-6));
    }
    // Integer sums are exact: equality, not a tolerance.
    for (size_t i = 0; i < count * world; ++i) {
      int64_t expect = 0;
      for (int q = 0; q < world; ++q) expect += IntValue(q, i);
      if (i / count == static_cast<size_t>(r)) {
        REQUIRE(results[r].int_reduce_scattered[i % count] == expect);
      }
      REQUIRE(results[r].int_all_reduced[i] == expect);
    }
    for (int q = 0; q < world; ++q) CHECK(results[r].gathered[q * 37] == q + 1);
    CHECK(results[r].broadcast == std::vector<uint8_t>(64, 0xab));
  }
}

TEST_CASE("NCCL backend reports unavailability as an error, not a crash", "[cuda]") {
  if (NcclAvailable()) {
    if (CudaDeviceCount() == 0) {
      // Creating a communicator on a missing device must fail cleanly.
      auto id = NcclNewUniqueId();
      if (id.ok()) {
        auto comm = CreateNcclComm(*id, 0, 1, 0);
        CHECK(!comm.ok());
      } else {
        CHECK(!id.status().message().empty());
      }
    }
    return;
  }
  auto comm = CreateNcclComm(NcclId{}, 0, 1, 0);
  REQUIRE(!comm.ok());
  CHECK(comm.status().code() == ckpt::StatusCode::kUnimplemented);
}
