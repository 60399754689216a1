// Allreduce tests: exact references for every dtype x op x count, bitwise
// agreement on random (non-associative) data, subgroups, argument errors.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/reduce_kernels.h"
#include "kernels.h"
#include "util.h"
#include "values.h"

namespace algtest {

// Counts: empty, single, not divisible by any world size, around the
// recursive-doubling / ring threshold, and large (ring, several pieces).
inline const std::vector<int64_t>& AllreduceCounts() {
  static const std::vector<int64_t> v = {0, 1, 7, 16411, 1000003};
  return v;
}

// One case per (world, dtype): every op and count, each rank's result
// compared bitwise with the exact reference (hence also with each other).
inline void TestAllreduceExact(int world, DataType dt) {
  struct Job {
    ReduceOp op;
    int64_t count;
    std::vector<std::vector<char>> in;
    std::vector<char> ref;
  };
  std::vector<Job> jobs;
  for (ReduceOp op : ReduceOps()) {
    for (int64_t count : AllreduceCounts()) {
      Job j{op, count, {}, MakeReference(dt, op, Iota(world), 0, count)};
      for (int r = 0; r < world; ++r) j.in.push_back(MakeInput(dt, op, r, count));
      jobs.push_back(std::move(j));
    }
  }
  const size_t es = hvdlite::DataTypeSize(dt);
  RunRanks(world, std::string("allreduce-") + hvdlite::DataTypeName(dt),
           [&](int rank, Transport* t, SpinBarrier*) {
             uint32_t tag = 1000;
             for (const Job& job : jobs) {
               std::vector<char> buf = job.in[rank];
               const Group g = MakeGroup(t, Iota(world), rank, tag += 64);
               const std::string where = Where("Allreduce", world, rank, dt, job.op, job.count);
               if (!Check().ExpectOk(hvdlite::Allreduce(g, buf.data(), job.count, dt, job.op), where)) return;
               const int64_t d = FirstDiff(buf.data(), job.ref.data(), static_cast<size_t>(job.count) * es);
               Check().Expect(d < 0, where + ": wrong result at byte " + std::to_string(d));
             }
           });
}

// Random data with NaNs and signed zeros: results need not match a reference
// exactly, but must be bitwise identical on every rank (and close to the sum).
inline void TestAllreduceAgreement(int world, DataType dt, ReduceOp op) {
  const std::vector<int64_t> counts = {7, 3000, 100003};
  const size_t es = hvdlite::DataTypeSize(dt);
  std::vector<std::vector<std::vector<char>>> in(counts.size()), out(counts.size());
  for (size_t c = 0; c < counts.size(); ++c) {
    for (int r = 0; r < world; ++r) {
      std::vector<char> b(counts[c] * es + 1);
      FillRandom(dt, &b, counts[c], 100 + r);
      for (int64_t i = 5; i < counts[c]; i += 101) Put(dt, b.data(), i, (r % 2) ? 0.0 : -0.0, 0);
      in[c].push_back(std::move(b));
    }
    out[c] = in[c];
  }
  RunRanks(world, "agree", [&](int rank, Transport* t, SpinBarrier*) {
    for (size_t c = 0; c < counts.size(); ++c) {
      const Group g = MakeGroup(t, Iota(world), rank, 500 + 64 * static_cast<uint32_t>(c));
      if (!Check().ExpectOk(hvdlite::Allreduce(g, out[c][rank].data(), counts[c], dt, op),
                            Where("Allreduce", world, rank, dt, op, counts[c])))
        return;
    }
  });
  for (size_t c = 0; c < counts.size(); ++c) {
    for (int r = 1; r < world; ++r) {
      const int64_t d = FirstDiff(out[c][r].data(), out[c][0].data(), counts[c] * es);
      Check().Expect(d < 0, Where("Allreduce agreement", world, r, dt, op, counts[c]) +
                                " differs from rank 0 at byte " + std::to_string(d));
    }
    // Where Allreduce ran recursive doubling, the local tree of the steady
    // state's voted inputs gives the same bits.
    if (hvdlite::AllreduceAlgorithm(counts[c] * static_cast<int64_t>(es), world) ==
        hvdlite::Algorithm::kRecursiveDoubling) {
      std::vector<const char*> parts;
      for (int r = 0; r < world; ++r) parts.push_back(in[c][r].data());
      std::vector<char> local(counts[c] * es + 1);
      const std::string where = Where("ReduceAsRecursiveDoubling", world, 0, dt, op, counts[c]);
      if (Check().ExpectOk(hvdlite::ReduceAsRecursiveDoubling(parts, local.data(), counts[c], dt, op),
                           where)) {
        const int64_t d = FirstDiff(local.data(), out[c][0].data(), counts[c] * es);
        Check().Expect(d < 0, where + " differs from Allreduce at byte " + std::to_string(d));
      }
    }
    if (op != ReduceOp::kSum || dt != DataType::kFloat64) continue;
    for (int64_t i = 0; i < counts[c]; ++i) {  // sanity: close to the exact sum
      double want = 0;
      for (int r = 0; r < world; ++r) want += BitsToDouble(dt, Load(dt, in[c][r], i));
      const double got = BitsToDouble(dt, Load(dt, out[c][0], i));
      if (!(std::isnan(want) ? std::isnan(got) : std::fabs(got - want) <= 1e-9 * (1 + std::fabs(want)))) {
        Check().Fail("float64 sum off at " + std::to_string(i));
        break;
      }
    }
  }
}

// Allreduce with a postscale (applied chunk by chunk inside the algorithm)
// gives the same bits as an unscaled Allreduce followed by ScaleBuffer, for
// a factor that is a float (0.5) and one that is not (1/3).
inline void TestAllreducePostscale(int world) {
  const std::vector<int64_t> counts = {7, 100003, 1000003};
  for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kBFloat16}) {
    const size_t es = hvdlite::DataTypeSize(dt);
    for (double factor : {0.5, 1.0 / 3.0}) {
      RunRanks(world, "postscale", [&](int rank, Transport* t, SpinBarrier*) {
        uint32_t tag = 64;
        for (int64_t count : counts) {
          std::vector<char> a(count * es + 1), b;
          FillRandom(dt, &a, count, 7 + rank);
          b = a;
          const std::string where = Where("Allreduce postscale", world, rank, dt, ReduceOp::kSum, count);
          Group g = MakeGroup(t, Iota(world), rank, tag += 64);
          if (!Check().ExpectOk(hvdlite::Allreduce(g, a.data(), count, dt, ReduceOp::kSum, factor), where))
            return;
          g.tag = tag += 64;
          if (!Check().ExpectOk(hvdlite::Allreduce(g, b.data(), count, dt, ReduceOp::kSum), where)) return;
          Check().ExpectOk(hvdlite::ScaleBuffer(b.data(), count, dt, factor), where);
          const int64_t d = FirstDiff(a.data(), b.data(), count * es);
          Check().Expect(
              d < 0, where + " factor " + std::to_string(factor) + " differs at byte " + std::to_string(d));
        }
      });
    }
  }
}

// World of 4 split into groups {0,2} and {1,3} running at once, then group
// {1,2,3} (member index != world rank) while rank 0 stays out.
inline void TestSubgroups() {
  const std::vector<std::vector<int>> pairs = {{0, 2}, {1, 3}};
  const std::vector<int> trio = {1, 2, 3};
  const std::vector<int64_t> counts = {7, 100003};
  RunRanks(4, "subgroups", [&](int rank, Transport* t, SpinBarrier*) {
    const std::vector<int>& mine = pairs[rank % 2];
    for (size_t ci = 0; ci < counts.size(); ++ci) {
      const int64_t count = counts[ci];
      for (const std::vector<int>* grp : {&mine, &trio}) {
        if (grp == &trio && rank == 0) continue;
        const DataType dt = grp == &trio ? DataType::kInt32 : DataType::kFloat32;
        std::vector<char> buf = MakeInput(dt, ReduceOp::kSum, rank, count);
        const std::vector<char> ref = MakeReference(dt, ReduceOp::kSum, *grp, 0, count);
        const uint32_t tag = static_cast<uint32_t>(64 * (1 + 2 * ci + (grp == &trio ? 1 : 0)));
        const Group g = MakeGroup(t, *grp, rank, tag);
        const std::string where =
            Where("subgroup Allreduce", static_cast<int>(grp->size()), rank, dt, ReduceOp::kSum, count);
        if (!Check().ExpectOk(hvdlite::Allreduce(g, buf.data(), count, dt, ReduceOp::kSum), where)) return;
        Check().Expect(FirstDiff(buf.data(), ref.data(), count * 4) < 0, where + ": wrong result");
      }
    }
  });
}

// Invalid calls fail the same way on every rank without sending anything:
// a correct collective right after still works.
inline void TestArgumentErrors() {
  RunRanks(2, "errors", [&](int rank, Transport* t, SpinBarrier*) {
    const Group g = MakeGroup(t, Iota(2), rank, 64);
    char b[16] = {0};
    auto code = [](const Status& s) { return s.code(); };
    using hvdlite::StatusCode;
    Check().Expect(
        code(hvdlite::Allreduce(g, b, 4, DataType::kBool, ReduceOp::kSum)) == StatusCode::kNotSupported,
        "bool allreduce");
    Check().Expect(
        code(hvdlite::Allreduce(g, b, 1, DataType::kFloat32, ReduceOp::kAdasum)) == StatusCode::kNotSupported,
        "Adasum allreduce");
    Check().Expect(code(hvdlite::Broadcast(g, b, 4, 2)) == StatusCode::kInvalidArgument,
                   "broadcast root 2 of 2");
    Check().Expect(code(hvdlite::Allgatherv(g, b, b, {1})) == StatusCode::kInvalidArgument,
                   "allgatherv sizes");
    Check().Expect(code(hvdlite::ReduceScatter(g, b, {1, 1, 1}, b, DataType::kInt32, ReduceOp::kSum)) ==
                       StatusCode::kInvalidArgument,
                   "reducescatter counts");
    Group bad = g;
    bad.me = 1 - g.me;
    Check().Expect(code(hvdlite::Allreduce(bad, b, 1, DataType::kFloat32, ReduceOp::kSum)) ==
                       StatusCode::kInvalidArgument,
                   "group member is another rank");
    int32_t v = rank + 1;
    Check().ExpectOk(hvdlite::Allreduce(g, &v, 1, DataType::kInt32, ReduceOp::kSum),
                     "allreduce after errors");
    Check().Expect(v == 3, "allreduce after errors: value");
  });
}

}  // namespace algtest
