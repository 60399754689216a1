// Allgatherv, Broadcast, Alltoallv and ReduceScatter tests over real TCP.
#pragma once
#include <numeric>
#include <string>
#include <vector>

#include "algorithms/algorithms.h"
#include "util.h"
#include "values.h"

namespace algtest {

inline char PatternByte(uint64_t a, uint64_t b, uint64_t i) { return static_cast<char>(Mix(a, b, i) & 0xff); }

inline int64_t Sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// Block-size patterns for `world` members: all empty, small uneven with zeros,
// large uneven with a zero.
inline std::vector<std::vector<int64_t>> BlockPatterns(int world) {
  std::vector<std::vector<int64_t>> out(3, std::vector<int64_t>(world));
  for (int i = 0; i < world; ++i) {
    out[0][i] = 0;
    out[1][i] = (i % 2 == 1) ? 0 : 3 + 7 * i;
    out[2][i] = (i == world - 1 && world > 1) ? 0 : 300001 + 333 * i;
  }
  return out;
}

// Every block pattern, with a separate send buffer and with send aliasing
// the rank's own slot in recv.
inline void TestAllgatherv(int world) {
  const auto patterns = BlockPatterns(world);
  RunRanks(world, "allgatherv", [&](int rank, Transport* t, SpinBarrier*) {
    uint32_t tag = 64;
    for (size_t p = 0; p < patterns.size(); ++p) {
      const std::vector<int64_t>& bytes = patterns[p];
      const int64_t off = Sum(std::vector<int64_t>(bytes.begin(), bytes.begin() + rank));
      for (int alias = 0; alias < 2; ++alias) {
        std::vector<char> send(bytes[rank] + 1), recv(Sum(bytes) + 1, 0x5a);
        for (int64_t i = 0; i < bytes[rank]; ++i) send[i] = PatternByte(rank, p, i);
        const void* src = send.data();
        if (alias) {
          std::copy(send.begin(), send.begin() + bytes[rank], recv.begin() + off);
          src = recv.data() + off;
        }
        const Group g = MakeGroup(t, Iota(world), rank, tag += 64);
        const std::string where = "Allgatherv world=" + std::to_string(world) +
                                  " rank=" + std::to_string(rank) + " pattern=" + std::to_string(p) +
                                  " alias=" + std::to_string(alias);
        if (!Check().ExpectOk(hvdlite::Allgatherv(g, src, recv.data(), bytes), where)) return;
        int64_t pos = 0;
        for (int m = 0; m < world; ++m) {
          for (int64_t i = 0; i < bytes[m]; ++i, ++pos) {
            if (recv[pos] != PatternByte(m, p, i)) {
              Check().Fail(where + ": wrong byte from member " + std::to_string(m));
              return;
            }
          }
        }
      }
    }
  });
}

// Every root, lengths for the binomial tree and for the pipelined chain.
inline void TestBroadcast(int world) {
  const std::vector<int64_t> lens = {0, 1, 1000, 300001, (1 << 20) + 3};
  RunRanks(world, "broadcast", [&](int rank, Transport* t, SpinBarrier*) {
    uint32_t tag = 64;
    for (int root = 0; root < world; ++root) {
      for (int64_t len : lens) {
        std::vector<char> buf(len + 1, 0x33);
        if (rank == root) {
          for (int64_t i = 0; i < len; ++i) buf[i] = PatternByte(root, len, i);
        }
        const Group g = MakeGroup(t, Iota(world), rank, tag += 64);
        const std::string where = "Broadcast world=" + std::to_string(world) +
                                  " rank=" + std::to_string(rank) + " root=" + std::to_string(root) +
                                  " len=" + std::to_string(len);
        if (!Check().ExpectOk(hvdlite::Broadcast(g, buf.data(), len, root), where)) return;
        for (int64_t i = 0; i < len; ++i) {
          if (buf[i] != PatternByte(root, len, i)) {
            Check().Fail(where + ": wrong byte " + std::to_string(i));
            break;
          }
        }
        Check().Expect(buf[len] == 0x33, where + ": wrote past the end");
      }
    }
  });
}

// Bytes member `src` sends to member `dst` in round `k` (zeros included,
// and in round 0 member 0 sends nothing at all).
inline int64_t SplitBytes(int src, int dst, int k) {
  if (k == 0 && src == 0) return 0;
  if ((src * 3 + dst * 5 + k) % 4 == 0) return 0;
  return static_cast<int64_t>(Mix(src, dst, k) % (k == 2 ? 200000 : 100)) + 1;
}

inline void TestAlltoallv(int world) {
  RunRanks(world, "alltoallv", [&](int rank, Transport* t, SpinBarrier*) {
    for (int k = 0; k < 3; ++k) {
      std::vector<int64_t> sb(world), rb(world);
      for (int j = 0; j < world; ++j) {
        sb[j] = SplitBytes(rank, j, k);
        rb[j] = SplitBytes(j, rank, k);
      }
      std::vector<char> send(Sum(sb) + 1), recv(Sum(rb) + 1, 0x11);
      int64_t pos = 0;
      for (int j = 0; j < world; ++j) {
        for (int64_t i = 0; i < sb[j]; ++i) send[pos++] = PatternByte(rank * 16 + j, k, i);
      }
      const Group g = MakeGroup(t, Iota(world), rank, 64 + 64 * k);
      const std::string where = "Alltoallv world=" + std::to_string(world) + " rank=" + std::to_string(rank) +
                                " round=" + std::to_string(k);
      if (!Check().ExpectOk(hvdlite::Alltoallv(g, send.data(), sb, recv.data(), rb), where)) return;
      pos = 0;
      for (int j = 0; j < world; ++j) {
        for (int64_t i = 0; i < rb[j]; ++i, ++pos) {
          if (recv[pos] != PatternByte(j * 16 + rank, k, i)) {
            Check().Fail(where + ": wrong byte from member " + std::to_string(j));
            return;
          }
        }
      }
    }
  });
}

// Every dtype and op, uneven block counts with zeros, small and large; the
// input must come back unmodified.
inline void TestReduceScatter(int world) {
  std::vector<std::vector<int64_t>> patterns(2, std::vector<int64_t>(world));
  for (int i = 0; i < world; ++i) {
    patterns[0][i] = (i % 2 == 1) ? 0 : 1 + 6 * i;
    patterns[1][i] = (i == 1) ? 0 : 70001 + 50000 * i;
  }
  RunRanks(world, "reducescatter", [&](int rank, Transport* t, SpinBarrier*) {
    uint32_t tag = 64;
    for (DataType dt : ReducibleTypes()) {
      for (ReduceOp op : ReduceOps()) {
        for (const auto& counts : patterns) {
          const size_t es = hvdlite::DataTypeSize(dt);
          const int64_t total = Sum(counts);
          const int64_t off = Sum(std::vector<int64_t>(counts.begin(), counts.begin() + rank));
          std::vector<char> buf = MakeInput(dt, op, rank, total);
          std::vector<char> out(counts[rank] * es + 1);
          const std::vector<char> ref = MakeReference(dt, op, Iota(world), off, counts[rank]);
          const Group g = MakeGroup(t, Iota(world), rank, tag += 64);
          const std::string where = Where("ReduceScatter", world, rank, dt, op, total);
          if (!Check().ExpectOk(hvdlite::ReduceScatter(g, buf.data(), counts, out.data(), dt, op), where))
            return;
          const int64_t d = FirstDiff(out.data(), ref.data(), counts[rank] * es);
          Check().Expect(d < 0, where + ": wrong byte " + std::to_string(d));
          Check().Expect(buf == MakeInput(dt, op, rank, total), where + ": the input was modified");
        }
      }
    }
  });
}

}  // namespace algtest
