// Tests of the transport's heartbeat (csrc/transport/heartbeat.h) over real
// loopback sockets: a peer process stopped with SIGSTOP (its sockets stay
// open) fails a pending receive within the bound, naming it; a peer whose
// transport thread is busy for longer than the bound, or that departed and
// closed, is not declared frozen. Prints "N passed, M failed".
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net_test_util.h"
#include "rendezvous/store_util.h"
#include "rendezvous/tcp_store.h"

using namespace hvdlite;
using namespace nettest;

namespace {

constexpr int kBoundS = 2;  // HVDLITE_LIVENESS_SECONDS for every transport here (its minimum)

Status Create(Store* store, const std::string& prefix, int rank, int size, std::unique_ptr<Transport>* out) {
  return CreateTcpTransport(store, prefix, rank, size, "127.0.0.1", kSecret, 10.0, 30.0, out, kBoundS);
}

// Rank 1 runs in a child process forked before this program starts any thread
// (the parent starts the store only after the fork and sends its port through a
// pipe); it builds its transport and stops itself.
[[noreturn]] void FrozenChild(int port_pipe) {
  int port = 0;
  if (::read(port_pipe, &port, sizeof(port)) != sizeof(port)) ::_exit(2);
  std::unique_ptr<Store> store;
  if (!ConnectTcpStore("127.0.0.1:" + std::to_string(port), "s3cret", 10.0, &store).ok()) ::_exit(3);
  std::unique_ptr<Transport> t;
  if (!Create(store.get(), "frozen/", 1, 2, &t).ok()) ::_exit(4);
  ::raise(SIGSTOP);
  ::_exit(0);
}

void TestStoppedPeerIsFound() {
  int fds[2];
  if (::pipe(fds) != 0) return Check(false, "pipe");
  const pid_t child = ::fork();
  if (child == 0) FrozenChild(fds[0]);
  std::unique_ptr<TcpStoreServer> server;
  CheckOk(StartTcpStoreServer("127.0.0.1", 0, "s3cret", &server), "start store server");
  const int port = server ? server->port() : 0;
  Check(::write(fds[1], &port, sizeof(port)) == sizeof(port), "port to the child");
  std::unique_ptr<Store> store;
  std::unique_ptr<Transport> t;
  if (server) CheckOk(ConnectTcpStore("127.0.0.1:" + std::to_string(port), "s3cret", 10.0, &store), "store");
  if (store) CheckOk(Create(store.get(), "frozen/", 0, 2, &t), "rank 0's transport");
  if (t) {
    char buf[8];
    const double t0 = Now();
    Status st = t->Recv(1, 7, buf, sizeof(buf));  // rank 1 stops instead of sending
    const double dt = Now() - t0;
    Check(st.code() == StatusCode::kAborted && Contains(st.message(), "rank 1 stopped responding") &&
              Contains(st.message(), "no heartbeat"),
          "a stopped peer is named: " + st.message());
    // The bound (2 s) plus a beat period, far below the 30 s transfer timeout.
    Check(dt < kBoundS + 1.5, "a stopped peer is found within the bound (" + std::to_string(dt) + " s)");
    std::printf("stopped peer found after %.2f s: %s\n", dt, st.message().c_str());
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]);
  ::close(fds[1]);
}

// Rank 1's transport thread does nothing for 2.5 bounds, then sends: rank 0's
// receive, waiting all that time, completes.
void TestBusyPeerIsAlive(Store* store) {
  Mesh mesh(2);
  RunThreads(2, [&](int r) { CheckOk(Create(store, "busy/", r, 2, &mesh[r]), "busy mesh"); });
  if (!mesh[0] || !mesh[1]) return;
  OnRanks(mesh, [&](int r, Transport* t) {
    int v = 41;
    if (r == 1) {
      SleepMs(kBoundS * 2500);
      CheckOk(t->Send(0, 3, &v, sizeof(v)), "busy peer sends");
      return;
    }
    v = 0;
    CheckOk(t->Recv(1, 3, &v, sizeof(v)), "receive from a busy peer");
    Check(v == 41, "payload from a busy peer");
  });
}

// A peer that departs and closes: the survivor waits past the bound without an error.
void TestDepartedPeerIsNotFrozen(Store* store) {
  Mesh mesh(3);
  RunThreads(3, [&](int r) { CheckOk(Create(store, "gone/", r, 3, &mesh[r]), "departing mesh"); });
  if (!mesh[0] || !mesh[1] || !mesh[2]) return;
  mesh[2]->Depart();
  mesh[2]->Close();
  OnRanks(mesh, [&](int r, Transport* t) {
    if (r == 2) return;
    std::vector<ControlMessage> msgs;
    const double end = Now() + kBoundS * 1.5;
    Status st;
    while (st.ok() && Now() < end) st = t->WaitControl(-1, 200, &msgs);
    CheckOk(st, "rank " + std::to_string(r) + " after its neighbour departed");
  });
}

}  // namespace

int main() {
  TestStoppedPeerIsFound();  // first: it forks before any thread exists
  std::unique_ptr<Store> store = NewMemoryStore();
  std::thread departed([&] { TestDepartedPeerIsNotFrozen(store.get()); });
  TestBusyPeerIsAlive(store.get());
  departed.join();
  std::printf("%d passed, %d failed\n", g_passed.load(), g_failed.load());
  return g_failed.load() == 0 ? 0 : 1;
}
