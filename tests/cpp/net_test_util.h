// Helpers for test_net.cc: a thread-safe check counter and ranks-as-threads meshes.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

namespace nettest {

inline std::atomic<int> g_passed{0};
inline std::atomic<int> g_failed{0};
inline std::mutex g_print_mu;

inline void Check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  std::lock_guard<std::mutex> lock(g_print_mu);
  std::printf("FAILED: %s\n", what.c_str());
  std::fflush(stdout);
}

inline void CheckOk(const hvdlite::Status& st, const std::string& what) {
  Check(st.ok(), what + (st.ok() ? "" : " -> " + st.message()));
}

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Runs fn(rank) on `n` threads and joins them.
inline void RunThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

using Mesh = std::vector<std::unique_ptr<hvdlite::Transport>>;

inline const char* kSecret = "test-secret-\x01\x02\x03";

// Builds an n-rank TCP mesh over a shared store, one thread per rank.
inline Mesh BuildMesh(hvdlite::Store* store, const std::string& prefix, int n, double io_timeout_s = 10.0,
                      double connect_timeout_s = 10.0) {
  Mesh mesh(n);
  RunThreads(n, [&](int r) {
    hvdlite::Status st = hvdlite::CreateTcpTransport(store, prefix, r, n, "127.0.0.1", kSecret,
                                                     connect_timeout_s, io_timeout_s, &mesh[r]);
    CheckOk(st, prefix + " mesh rank " + std::to_string(r));
  });
  for (auto& t : mesh) {
    if (t == nullptr) return Mesh();
  }
  return mesh;
}

// Runs fn(rank, transport) for every rank of the mesh, one thread each.
inline void OnRanks(Mesh& mesh, const std::function<void(int, hvdlite::Transport*)>& fn) {
  RunThreads(int(mesh.size()), [&](int r) { fn(r, mesh[r].get()); });
}

}  // namespace nettest
