// `test_algorithms --bench [WORLD [tcp|shm]]`: allreduce busbw of WORLD
// thread-ranks over the chosen transport, float32 Sum, in place. Information
// only, never asserted.
// Conventions (those of nccl-tests): busbw = bytes / time * 2(n-1)/n; every
// repetition starts after a barrier, its time is the max over ranks; the
// median (and min) over repetitions is reported; small sizes time K calls.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "algorithms/algorithms.h"
#include "util.h"

namespace algtest {

struct BenchSize {
  int64_t bytes;
  int reps;
  int calls;  // back-to-back calls per repetition
};

inline int RunBench(int world) {
  const std::vector<BenchSize> sizes = {{4 << 10, 30, 200}, {64 << 10, 30, 50}, {1 << 20, 30, 10},
                                        {16 << 20, 15, 1},  {64 << 20, 8, 1},   {256 << 20, 5, 1}};
  std::vector<std::vector<double>> secs(sizes.size());  // per repetition, max over ranks
  std::vector<double> rank_time(world);
  int wrong = 0;
  RunRanks(world, "bench", [&](int rank, Transport* t, SpinBarrier* barrier) {
    uint32_t tag = 64;
    for (size_t s = 0; s < sizes.size(); ++s) {
      const int64_t count = sizes[s].bytes / 4;
      std::vector<float> buf(count, static_cast<float>(rank + 1));  // correctness pass first
      Group g = MakeGroup(t, Iota(world), rank, tag += 64);
      Check().ExpectOk(hvdlite::Allreduce(g, buf.data(), count, DataType::kFloat32, ReduceOp::kSum), "bench");
      const float want = static_cast<float>(world * (world + 1) / 2);
      if (rank == 0)
        wrong += static_cast<int>(std::count_if(buf.begin(), buf.end(), [&](float v) { return v != want; }));
      std::fill(buf.begin(), buf.end(), 0.0f);
      for (int w = 0; w < 3; ++w)
        hvdlite::Allreduce(g, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
      for (int r = 0; r < sizes[s].reps; ++r) {
        barrier->Wait();
        const auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < sizes[s].calls; ++k) {
          hvdlite::Allreduce(g, buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
        }
        rank_time[rank] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / sizes[s].calls;
        barrier->Wait();
        if (rank == 0) secs[s].push_back(*std::max_element(rank_time.begin(), rank_time.end()));
      }
    }
  });
  std::printf("allreduce float32 sum, %d thread-ranks over %s (in place); #wrong=%d\n", world,
              TransportKind() == "shm" ? "shared memory" : "TCP 127.0.0.1", wrong);
  std::printf("%12s %12s %12s %14s %14s\n", "bytes", "median_us", "min_us", "busbw_GB/s", "best_busbw");
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<double> v = secs[s];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2], best = v.front();
    const double factor = 2.0 * (world - 1) / world;
    const double b = static_cast<double>(sizes[s].bytes);
    std::printf("%12lld %12.1f %12.1f %14.3f %14.3f\n", static_cast<long long>(sizes[s].bytes), med * 1e6,
                best * 1e6, b / med * factor / 1e9, b / best * factor / 1e9);
  }
  return Check().count() == 0 ? 0 : 1;
}

}  // namespace algtest
