// Tests of the collective algorithms layer (csrc/algorithms): reduction
// kernels and conversions, then every collective with ranks as threads of
// this process over the real transports (TCP on 127.0.0.1, then the
// shared-memory transport), world sizes 1-4. Case names start with the
// transport ("tcp/", "shm/").
//
//   test_algorithms            run every case; prints "N passed, M failed" last,
//                              exit status 0 only when nothing failed
//   test_algorithms FILTER     only cases whose name contains FILTER
//   test_algorithms --bench [WORLD [tcp|shm [CHANNEL_BYTES]]]
//                              allreduce busbw, WORLD (2) thread-ranks over
//                              shm (default) or tcp (information only)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "algtest/allreduce_tests.h"
#include "algtest/bench.h"
#include "algtest/collective_tests.h"
#include "algtest/kernels.h"

namespace {

int g_passed = 0;
int g_failed = 0;
// Case selection from the command line: `test_algorithms [PATTERN...]` runs the cases whose name
// contains any PATTERN (all cases when there is none), except those containing a -PATTERN.
// tests/test_cpp.py runs `-/world3 -/world4` by default and the 3- and 4-rank cases as slow.
std::vector<std::string> g_include;
std::vector<std::string> g_exclude;

bool Selected(const std::string& name) {
  for (const std::string& p : g_exclude) {
    if (name.find(p) != std::string::npos) return false;
  }
  if (g_include.empty()) return true;
  for (const std::string& p : g_include) {
    if (name.find(p) != std::string::npos) return true;
  }
  return false;
}

void RunCase(const std::string& name, const std::function<void()>& body) {
  if (!Selected(name)) return;
  algtest::Check().Reset();
  const auto t0 = std::chrono::steady_clock::now();
  body();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int failures = algtest::Check().count();
  if (failures == 0) {
    ++g_passed;
    std::printf("PASS %s (%.2fs)\n", name.c_str(), secs);
  } else {
    ++g_failed;
    std::printf("FAIL %s: %d failed checks\n", name.c_str(), failures);
    for (const std::string& m : algtest::Check().messages()) std::printf("    %s\n", m.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  using hvdlite::DataType;
  using hvdlite::ReduceOp;
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
    algtest::UseTransport(argc > 3 ? argv[3] : "shm");
    algtest::ShmChannelBytes() =
        argc > 4 ? std::strtoull(argv[4], nullptr, 10) : hvdlite::ShmOptions().channel_bytes;
    return algtest::RunBench(argc > 2 ? std::atoi(argv[2]) : 2);
  }
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') {
      g_exclude.emplace_back(argv[i] + 1);
    } else {
      g_include.emplace_back(argv[i]);
    }
  }

  std::printf("float16 block conversions: %s\n", hvdlite::halfblock::HalfImplName());
  RunCase("kernels/conversions", algtest::TestConversions);
  RunCase("kernels/block_conversions", algtest::TestBlockConversions);
  RunCase("kernels/reduce_into", algtest::TestReduceInto);
  RunCase("kernels/scalar_cases", algtest::TestScalarCases);
  for (const char* kind : {"tcp", "shm"}) {
    algtest::UseTransport(kind);
    const std::string k = std::string(kind) + "/";
    for (int world = 1; world <= 4; ++world) {
      const std::string w = "/world" + std::to_string(world);
      for (DataType dt : algtest::ReducibleTypes()) {
        RunCase(k + "allreduce_exact/" + hvdlite::DataTypeName(dt) + w,
                [&] { algtest::TestAllreduceExact(world, dt); });
      }
      for (DataType dt : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64}) {
        for (ReduceOp op : algtest::ReduceOps()) {
          RunCase(
              k + "allreduce_agreement/" + hvdlite::DataTypeName(dt) + "/" + hvdlite::ReduceOpName(op) + w,
              [&] { algtest::TestAllreduceAgreement(world, dt, op); });
        }
      }
      RunCase(k + "allreduce_postscale" + w, [&] { algtest::TestAllreducePostscale(world); });
      RunCase(k + "allgatherv" + w, [&] { algtest::TestAllgatherv(world); });
      RunCase(k + "broadcast" + w, [&] { algtest::TestBroadcast(world); });
      RunCase(k + "alltoallv" + w, [&] { algtest::TestAlltoallv(world); });
      RunCase(k + "reducescatter" + w, [&] { algtest::TestReduceScatter(world); });
    }
    for (int world : {6, 7}) {  // recursive doubling with 2 and 3 members folded in
      RunCase(k + "allreduce_agreement/float32/sum/world" + std::to_string(world),
              [&] { algtest::TestAllreduceAgreement(world, DataType::kFloat32, ReduceOp::kSum); });
    }
    RunCase(k + "subgroups/world4", algtest::TestSubgroups);
    RunCase(k + "argument_errors/world2", algtest::TestArgumentErrors);
  }

  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
