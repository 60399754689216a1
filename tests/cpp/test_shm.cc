// Tests of the shared-memory transport (csrc/transport/shm_*) with ranks as
// threads: exchanges of every size through the rings, reduce-on-receive,
// control (large, interleaved with data), ranks on two "hosts" (shared
// memory within, TCP across), errors (tag mismatch, timeout, a peer that
// crashes or departs while others wait on it), fallback to TCP, the
// point-to-point arena peers map, and no leftovers in /dev/shm. Prints "N passed, M failed".
#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <numeric>

#include "common/crypto.h"
#include "net_test_util.h"
#include "transport/shm_transport.h"

using namespace hvdlite;
using namespace nettest;

namespace {

constexpr size_t kChannel = 64 << 10;  // small data rings (8 KiB slots): messages wrap them many times

// Builds an n-rank shm mesh; hosts[r] groups ranks (default: one host).
Mesh BuildShmMesh(Store* store, const std::string& prefix, int n, std::vector<std::string> hosts = {},
                  double io_timeout_s = 10.0, bool disable = false, size_t arena_bytes = 0) {
  if (hosts.empty()) hosts.assign(n, "host");
  ShmOptions opts;
  opts.channel_bytes = kChannel;
  opts.disable = disable;
  opts.p2p_arena_bytes = arena_bytes;
  Mesh mesh(n);
  RunThreads(n, [&](int r) {
    Status st = CreateShmTransport(store, prefix, r, n, "127.0.0.1", kSecret, 10.0, io_timeout_s, hosts, opts,
                                   &mesh[r]);
    CheckOk(st, prefix + " shm mesh rank " + std::to_string(r));
  });
  for (auto& t : mesh) {
    if (t == nullptr) return Mesh();
  }
  return mesh;
}

int LinkedPeers(Transport* t) {
  auto* s = dynamic_cast<ShmTransport*>(t);
  return s ? s->linked_peers() : 0;
}

void Fill(std::vector<char>* buf, int sender) {
  for (size_t i = 0; i < buf->size(); ++i)
    (*buf)[i] = char((i * 131 + size_t(sender) * 7 + buf->size()) & 0xff);
}

// Ring both ways and rank 0 to all, for sizes around the slot and ring sizes.
void TestExchange(Store* store, int n, const std::vector<std::string>& hosts, const std::string& name) {
  Mesh mesh = BuildShmMesh(store, name + "/", n, hosts);
  if (mesh.empty()) return;
  const size_t sizes[] = {0, 1, 4096, 8 << 10, (8 << 10) + 1, 3 * kChannel + 17, 10u << 20};
  OnRanks(mesh, [&](int r, Transport* t) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (size_t len : sizes) {
      std::vector<char> out(len), in(len, 0x5a), want(len);
      Fill(&out, r);
      Fill(&want, prev);
      const std::string what = name + " rank " + std::to_string(r) + " len " + std::to_string(len);
      CheckOk(t->SendRecv(next, uint32_t(len), out.data(), len, prev, uint32_t(len), in.data(), len), what);
      Check(in == want, what + " ring content");
      CheckOk(t->SendRecv(prev, 7, out.data(), len, next, 7, in.data(), len), what + " reverse");
      Fill(&want, next);
      Check(in == want, what + " reverse content");
      if (r == 0) {
        for (int p = 1; p < n; ++p) CheckOk(t->Send(p, 9, out.data(), len), what + " send");
      } else {
        Fill(&want, 0);
        CheckOk(t->Recv(0, 9, in.data(), len), what + " recv");
        Check(in == want, what + " recv content");
      }
    }
  });
}

Status AddInts(const void*, void* dst, const void* src, size_t bytes) {
  int32_t* d = static_cast<int32_t*>(dst);
  const int32_t* s = static_cast<const int32_t*>(src);
  for (size_t i = 0; i < bytes / 4; ++i) d[i] += s[i];
  return Status::OK();
}

// SendRecvReduce around a ring: every element ends as own + prev's.
void TestReduce(Store* store, int n, const std::vector<std::string>& hosts, const std::string& name) {
  Mesh mesh = BuildShmMesh(store, name + "/", n, hosts);
  if (mesh.empty()) return;
  Reducer add;
  add.fn = &AddInts;
  add.unit = 4;
  OnRanks(mesh, [&](int r, Transport* t) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (size_t count : {size_t(0), size_t(3), size_t(2048), size_t(1) << 20}) {
      std::vector<int32_t> out(count), acc(count);
      std::iota(out.begin(), out.end(), r * 1000);
      std::iota(acc.begin(), acc.end(), 7);
      const std::string what = name + " rank " + std::to_string(r) + " count " + std::to_string(count);
      CheckOk(t->SendRecvReduce(next, 3, out.data(), count * 4, prev, 3, acc.data(), count * 4, add), what);
      bool ok = true;
      for (size_t i = 0; i < count && ok; ++i) ok = acc[i] == int32_t(7 + i + prev * 1000 + i);
      Check(ok, what + " reduced content");
    }
  });
}

// A control message much larger than the control ring, sent while the
// receiver is blocked in a data receive from the same sender.
void TestControl(Store* store) {
  Mesh mesh = BuildShmMesh(store, "shmctrl/", 2);
  if (mesh.empty()) return;
  std::string big(1 << 20, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char(i * 7);
  OnRanks(mesh, [&](int r, Transport* t) {
    if (r == 0) {
      CheckOk(t->SendControl(1, "first"), "control first");
      CheckOk(t->SendControl(1, big), "control 1 MiB while the peer waits for data");
      CheckOk(t->SendControl(1, ""), "control empty");
      int v = 42;
      CheckOk(t->Send(1, 5, &v, sizeof(v)), "data after control");
      return;
    }
    int v = 0;
    CheckOk(t->Recv(0, 5, &v, sizeof(v)), "data receive drains control meanwhile");
    Check(v == 42, "data after control content");
    std::vector<ControlMessage> msgs;
    CheckOk(t->WaitControl(-1, 1000, &msgs), "control wait");
    Check(msgs.size() == 3 && msgs[0].payload == "first" && msgs[1].payload == big &&
              msgs[2].payload.empty() && msgs[1].peer == 0,
          "control messages complete and in order");
  });
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::thread waker([&] {
    SleepMs(50);
    uint64_t one = 1;
    ssize_t rc = ::write(efd, &one, sizeof(one));
    (void)rc;
  });
  std::vector<ControlMessage> msgs;
  double t0 = Now();
  CheckOk(mesh[0]->WaitControl(efd, 5000, &msgs), "shm wait wakes on eventfd");
  double dt = Now() - t0;
  waker.join();
  Check(msgs.empty() && dt >= 0.04 && dt < 1.0, "shm eventfd wake time " + std::to_string(dt));
  ::close(efd);
  std::thread late([&] {
    SleepMs(100);
    CheckOk(mesh[1]->SendControl(0, "late"), "late control");
  });
  t0 = Now();
  CheckOk(mesh[0]->WaitControl(-1, 5000, &msgs), "sleeping control wait");
  dt = Now() - t0;
  late.join();
  Check(msgs.size() == 1 && msgs[0].payload == "late" && dt < 1.0, "a sleeping wait is nudged awake");
  t0 = Now();
  CheckOk(mesh[1]->WaitControl(-1, 100, &msgs), "shm wait timeout");
  dt = Now() - t0;
  Check(dt >= 0.09 && dt < 1.0, "shm wait timeout time " + std::to_string(dt));
}

void TestTagMismatchAndTimeout(Store* store) {
  Mesh mesh = BuildShmMesh(store, "shmtags/", 2);
  if (mesh.empty()) return;
  char buf[4] = {1, 2, 3, 4};
  CheckOk(mesh[0]->Send(1, 5, buf, 4), "shm tag mismatch: send");
  Status st = mesh[1]->Recv(0, 6, buf, 4);
  Check(st.code() == StatusCode::kInternal && Contains(st.message(), "tag 6") &&
            Contains(st.message(), "tag 5"),
        "shm tag mismatch names both tags: " + st.message());
  std::vector<ControlMessage> msgs;
  st = mesh[0]->WaitControl(-1, 2000, &msgs);
  Check(st.code() == StatusCode::kAborted && Contains(st.message(), "rank 1"),
        "peer of a broken shm rank learns it: " + st.message());

  Mesh slow = BuildShmMesh(store, "shmtimeout/", 2, {}, 0.3);
  if (slow.empty()) return;
  double t0 = Now();
  st = slow[1]->Recv(0, 42, buf, 4);
  double dt = Now() - t0;
  Check(st.code() == StatusCode::kTimeout && Contains(st.message(), "rank 0") &&
            Contains(st.message(), "tag 42"),
        "shm io timeout names peer and tag: " + st.message());
  Check(dt >= 0.29 && dt < 2.0, "shm io timeout duration " + std::to_string(dt));
}

double ThreadCpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Rank 0 closes without Depart (a crash) while rank 1 waits to receive from it
// and rank 2 waits to send to it through a full ring.
void TestPeerCrash(Store* store) {
  Mesh mesh = BuildShmMesh(store, "shmcrash/", 3);
  if (mesh.empty()) return;
  std::atomic<double> closed_at{0};
  OnRanks(mesh, [&](int r, Transport* t) {
    if (r == 0) {
      SleepMs(300);
      closed_at = Now();
      t->Close();
      return;
    }
    std::vector<char> buf(4 * kChannel);
    const double cpu0 = ThreadCpuSeconds();
    Status st = r == 1 ? t->Recv(0, 1, buf.data(), buf.size()) : t->Send(0, 1, buf.data(), buf.size());
    const double cpu = ThreadCpuSeconds() - cpu0;
    const double delay = Now() - closed_at.load();
    Check(st.code() == StatusCode::kAborted && Contains(st.message(), "rank 0"),
          "crash of rank 0 during a shm transfer seen by rank " + std::to_string(r) + ": " + st.message());
    Check(delay < 0.5, "crash noticed promptly (" + std::to_string(delay) + "s)");
    Check(cpu < 0.15, "a waiting transfer sleeps (" + std::to_string(cpu) + " s of CPU in 0.3 s)");
  });
}

void TestDepart(Store* store) {
  Mesh mesh = BuildShmMesh(store, "shmdepart/", 3);
  if (mesh.empty()) return;
  mesh[0]->Depart();
  mesh[0]->Close();
  OnRanks(mesh, [&](int r, Transport* t) {
    if (r == 0) return;
    std::vector<ControlMessage> msgs;
    for (int i = 0; i < 3; ++i) CheckOk(t->WaitControl(-1, 100, &msgs), "shm wait after a peer departed");
    Check(t->PeerDeparted(0) && !t->PeerDeparted(3 - r), "shm PeerDeparted");
    int other = 3 - r, out = r, in = -1;
    CheckOk(t->SendRecv(other, 3, &out, sizeof(out), other, 3, &in, sizeof(in)),
            "shm survivors still exchange");
    Check(in == other, "shm survivors exchange content");
  });
  int x = 0;
  Status st = mesh[1]->Recv(0, 1, &x, sizeof(x));
  Check(st.code() == StatusCode::kAborted && Contains(st.message(), "rank 0 has shut down"),
        "shm recv from departed rank: " + st.message());
}

// Names in /dev/shm that belong to segments made with kSecret.
int Leftovers() {
  Digest256 d{};
  HmacSha256(kSecret, "hvdlite-shm-segment", &d);
  const std::string tag = "hvdlite-" + HexEncode(d.data(), 8);
  int n = 0;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(dir)) n += std::strncmp(e->d_name, tag.c_str(), tag.size()) == 0 ? 1 : 0;
    ::closedir(dir);
  }
  return n;
}

void TestSetupAndFallback(Store* store) {
  Mesh mesh = BuildShmMesh(store, "shmlinks/", 4, {"a", "a", "b", "b"});
  if (!mesh.empty()) {
    Check(Leftovers() == 0, "segments are unlinked once the mesh is up");
    for (int r = 0; r < 4; ++r) Check(LinkedPeers(mesh[r].get()) == 1, "two hosts: one shm peer each");
  }
  Mesh off = BuildShmMesh(store, "shmoff/", 2, {}, 10.0, /*disable=*/true);
  if (!off.empty()) {
    Check(dynamic_cast<ShmTransport*>(off[0].get()) == nullptr, "disabled shm gives the TCP transport");
    OnRanks(off, [&](int r, Transport* t) {
      int out = r, in = -1;
      CheckOk(t->SendRecv(1 - r, 1, &out, sizeof(out), 1 - r, 1, &in, sizeof(in)), "TCP fallback exchange");
      Check(in == 1 - r, "TCP fallback content");
    });
  }
  Mesh solo = BuildShmMesh(store, "shmsolo/", 3, {"x", "y", "z"});
  if (!solo.empty()) Check(LinkedPeers(solo[1].get()) == 0, "ranks on different hosts use TCP only");
}

// The point-to-point arena: each rank's is mapped by its shared-memory peers
// (what the owner writes after reserving, the peer reads), its size rounds up
// to the alignment, reserving past it fails, and peers over TCP or a size of 0
// have none.
void TestArena(Store* store) {
  Mesh mesh = BuildShmMesh(store, "shmarena/", 3, {"a", "a", "b"}, 10.0, false, 100 << 10);
  if (mesh.empty()) return;
  const P2pArenaView own = mesh[0]->OwnP2pArena();
  Check(own.base != nullptr && own.bytes == 128 << 10, "the arena's size rounds up to 64 KiB");
  const P2pArenaView seen = mesh[1]->PeerP2pArena(0);
  Check(seen.base != nullptr && seen.bytes == own.bytes, "a shared-memory peer maps the arena");
  Check(mesh[0]->PeerP2pArena(2).base == nullptr && mesh[2]->OwnP2pArena().base == nullptr,
        "ranks without a shared-memory peer neither map nor own one");
  CheckOk(mesh[0]->ReserveP2pArena(own.bytes), "reserving the whole arena");
  for (size_t i = 0; i < own.bytes; i += 4096) own.base[i] = static_cast<char>(i / 4096 + 1);
  bool same = true;
  for (size_t i = 0; i < own.bytes; i += 4096) same = same && seen.base[i] == static_cast<char>(i / 4096 + 1);
  Check(same, "what the owner writes, its peer reads");
  Check(!mesh[0]->ReserveP2pArena(own.bytes + 1).ok(), "reserving past the arena fails");
  Mesh none = BuildShmMesh(store, "shmnoarena/", 2);
  if (!none.empty()) {
    Check(none[0]->OwnP2pArena().base == nullptr && none[1]->PeerP2pArena(0).base == nullptr,
          "an arena size of 0 gives none");
  }
}

}  // namespace

int main() {
  std::unique_ptr<Store> store = NewMemoryStore();
  for (int n : {2, 3, 4}) TestExchange(store.get(), n, {}, "shm" + std::to_string(n));
  TestExchange(store.get(), 4, {"a", "a", "b", "b"}, "mixed4");
  TestReduce(store.get(), 3, {}, "reduce3");
  TestReduce(store.get(), 4, {"a", "b", "b", "a"}, "reducemixed4");
  TestControl(store.get());
  TestTagMismatchAndTimeout(store.get());
  TestPeerCrash(store.get());
  TestDepart(store.get());
  TestSetupAndFallback(store.get());
  TestArena(store.get());
  Check(Leftovers() == 0, "no segment left in /dev/shm");
  std::printf("%d passed, %d failed\n", g_passed.load(), g_failed.load());
  return g_failed.load() == 0 ? 0 : 1;
}
