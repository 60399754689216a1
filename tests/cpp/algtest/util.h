// Test harness for test_algorithms: ranks are threads of this process, each
// with its own real transport (TCP on 127.0.0.1, or the shared-memory
// transport over it: see UseTransport), rendezvousing through one shared
// MemoryStore (a distinct key prefix per test case).
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/group.h"
#include "common/dtype.h"
#include "common/status.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

namespace algtest {

using hvdlite::DataType;
using hvdlite::Group;
using hvdlite::ReduceOp;
using hvdlite::Status;
using hvdlite::Transport;

// Failures of the current test case; thread-safe.
class Checker {
 public:
  void Fail(const std::string& msg) {
    std::lock_guard<std::mutex> lk(mu_);
    if (msgs_.size() < 8) msgs_.push_back(msg);
    ++count_;
  }
  // Records a failure when !cond; returns cond.
  bool Expect(bool cond, const std::string& msg) {
    if (!cond) Fail(msg);
    return cond;
  }
  bool ExpectOk(const Status& st, const std::string& what) {
    return Expect(st.ok(), what + ": " + st.message());
  }
  int count() const { return count_; }
  const std::vector<std::string>& messages() const { return msgs_; }
  void Reset() {
    msgs_.clear();
    count_ = 0;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> msgs_;
  std::atomic<int> count_{0};
};

inline Checker& Check() {
  static Checker c;
  return c;
}

// Reusable spinning barrier for `n` threads (spins with yield: no sleeps, so
// it adds no wake-up latency to the benchmark).
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void Wait() {
    const int gen = gen_.load();
    if (arrived_.fetch_add(1) + 1 == n_) {
      arrived_.store(0);
      gen_.fetch_add(1);
      return;
    }
    while (gen_.load() == gen) std::this_thread::yield();
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<int> gen_{0};
};

inline hvdlite::Store* SharedStore() {
  static std::unique_ptr<hvdlite::Store> store = hvdlite::NewMemoryStore();
  return store.get();
}

// Which transport RunRanks builds: "tcp" or "shm" (every rank on one host).
inline std::string& TransportKind() {
  static std::string kind = "tcp";
  return kind;
}
inline void UseTransport(const std::string& kind) { TransportKind() = kind; }
// Data ring per pair of the shm transport: small by default, so that test
// messages span many slots and wrap the ring.
inline size_t& ShmChannelBytes() {
  static size_t bytes = 256 << 10;
  return bytes;
}

inline Status CreateTestTransport(const std::string& prefix, int rank, int world,
                                  std::unique_ptr<Transport>* t) {
  if (TransportKind() == "shm") {
    hvdlite::ShmOptions opts;
    opts.channel_bytes = ShmChannelBytes();
    return hvdlite::CreateShmTransport(SharedStore(), prefix, rank, world, "127.0.0.1", "algtest-secret",
                                       30.0, 30.0, std::vector<std::string>(world, "host"), opts, t);
  }
  return hvdlite::CreateTcpTransport(SharedStore(), prefix, rank, world, "127.0.0.1", "algtest-secret", 30.0,
                                     30.0, t);
}

// Body of one rank: `t` is its transport (world rank `rank` of `world`).
using RankFn = std::function<void(int rank, Transport* t, SpinBarrier* barrier)>;

// Runs `fn` on `world` threads, each with a transport of TransportKind()
// under a fresh store prefix. Transports are torn down only after every rank has finished.
inline void RunRanks(int world, const std::string& name, const RankFn& fn) {
  static std::atomic<int> serial{0};
  const std::string prefix = "alg/" + name + "/" + std::to_string(serial.fetch_add(1)) + "/";
  SpinBarrier barrier(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> t;
      Status st = CreateTestTransport(prefix, r, world, &t);
      if (Check().ExpectOk(st, "rank " + std::to_string(r) + " create " + TransportKind() + " transport")) {
        fn(r, t.get(), &barrier);
      }
      barrier.Wait();
      if (t) t->Depart();
      barrier.Wait();
      t.reset();
    });
  }
  for (auto& th : threads) th.join();
}

// A group of the given world ranks, seen from world rank `rank` (which must be in it).
inline Group MakeGroup(Transport* t, const std::vector<int>& ranks, int rank, uint32_t tag) {
  Group g;
  g.transport = t;
  g.ranks = ranks;
  g.tag = tag;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank) g.me = static_cast<int>(i);
  }
  return g;
}

inline std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Deterministic 64-bit mix of a few integers (splitmix64).
inline uint64_t Mix(uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b * 0xBF58476D1CE4E5B9ull + c * 0x94D049BB133111EBull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::string Where(const char* what, int world, int rank, DataType dt, ReduceOp op, int64_t count) {
  return std::string(what) + " world=" + std::to_string(world) + " rank=" + std::to_string(rank) + " " +
         hvdlite::DataTypeName(dt) + " " + hvdlite::ReduceOpName(op) + " count=" + std::to_string(count);
}

// Index of the first differing byte, or -1.
inline int64_t FirstDiff(const void* a, const void* b, size_t n) {
  const unsigned char* x = static_cast<const unsigned char*>(a);
  const unsigned char* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace algtest
