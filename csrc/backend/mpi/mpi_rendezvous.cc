// Job formation under mpirun: MPI provides rank and size, rank 0 hosts a TCP
// store for the rest of the bootstrap (host names, transport addresses), and
// MPI_Bcast tells everyone where it is and the secret that admits them.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/mpi/mpi_world.h"
#include "common/crypto.h"
#include "common/logging.h"
#include "rendezvous/tcp_store.h"

namespace hvdlite {
namespace {

constexpr int kSecretBytes = 32;
constexpr int kMessageBytes = 1024;  // [status u8][secret 32][NUL-terminated text]

bool IsLoopback(const std::string& ip) { return ip.rfind("127.", 0) == 0; }

// An IPv4 address of this host that other hosts can reach: the host name's
// address when it is not a loopback one, else the first non-loopback address
// of an interface that is up; "" when there is none.
std::string ReachableAddress() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(name, nullptr, &hints, &res) == 0) {
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      char buf[INET_ADDRSTRLEN];
      auto* sin = reinterpret_cast<sockaddr_in*>(ai->ai_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf)) && !IsLoopback(buf)) {
        freeaddrinfo(res);
        return buf;
      }
    }
    freeaddrinfo(res);
  }
  ifaddrs* ifs = nullptr;
  std::string out;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf)) && !IsLoopback(buf)) out = buf;
  }
  freeifaddrs(ifs);
  return out;
}

// "" when libcrypto has no random bytes (the caller reports it).
std::string RandomSecret() {
  std::string s(kSecretBytes, '\0');
  return RandomBytes(&s[0], s.size()) ? s : "";
}

// Rank 0: starts the store and fills `msg`; a failure is written into msg
// too, so every rank fails with the same message instead of waiting.
void HostStore(bool one_host, MpiJob* job, char* msg) {
  std::string bind = "127.0.0.1", advertise = "127.0.0.1";
  if (!one_host) {
    advertise = ReachableAddress();
    bind = "0.0.0.0";
  }
  Status st;
  std::unique_ptr<TcpStoreServer> server;
  if (advertise.empty()) {
    st = Status::Internal(
        "rank 0 has no non-loopback IPv4 address for the other hosts to reach its "
        "rendezvous store");
  } else {
    job->secret = RandomSecret();
    // Rank 0 holds a store socket per rank and, later, a transport socket per peer.
    st = job->secret.empty()
             ? Status::Internal("rank 0 got no random bytes from libcrypto for the job secret")
             : StartTcpStoreServer(bind, 0, job->secret, &server, 2 * job->size);
  }
  std::string text = st.ok() ? advertise + ":" + std::to_string(server->port()) : st.message();
  msg[0] = st.ok() ? 1 : 0;
  std::memcpy(msg + 1, job->secret.data(), job->secret.size());
  std::strncpy(msg + 1 + kSecretBytes, text.c_str(), kMessageBytes - 2 - kSecretBytes);
  if (st.ok()) {
    TcpStoreServer* raw = server.release();
    job->store_server = std::shared_ptr<void>(raw, [](void* p) {
      auto* s = static_cast<TcpStoreServer*>(p);
      s->Stop();
      delete s;
    });
  }
}

// Completes a non-blocking collective, or fails after timeout_s: a rank that
// never reaches init() becomes an error instead of a silent hang.
Status Await(MPI_Request* req, double timeout_s, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    int done = 0;
    HVD_MPI_CALL(MPI_Test(req, &done, MPI_STATUS_IGNORE));
    if (done) return Status::OK();
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout(std::string("not every rank of MPI_COMM_WORLD reached hvd.init() within ") +
                             std::to_string(static_cast<int>(timeout_s)) +
                             " s (HVDLITE_START_TIMEOUT) while " + what);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// True when every rank runs on this host (same MPI processor name).
Status AllOnOneHost(MPI_Comm comm, int size, double timeout_s, bool* out) {
  char mine[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(mine, &len);
  std::vector<char> all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Request req;
  HVD_MPI_CALL(MPI_Iallgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                              MPI_CHAR, comm, &req));
  HVD_RETURN_IF_ERROR(Await(&req, timeout_s, "exchanging host names"));
  *out = true;
  for (int r = 1; r < size; ++r) {
    *out &= std::strncmp(all.data(), all.data() + r * MPI_MAX_PROCESSOR_NAME, MPI_MAX_PROCESSOR_NAME) == 0;
  }
  return Status::OK();
}

Status Exchange(MPI_Comm comm, double timeout_s, MpiJob* job) {
  bool one_host = false;
  HVD_RETURN_IF_ERROR(AllOnOneHost(comm, job->size, timeout_s, &one_host));
  char msg[kMessageBytes] = {0};
  if (job->rank == 0) HostStore(one_host, job, msg);
  MPI_Request req;
  HVD_MPI_CALL(MPI_Ibcast(msg, kMessageBytes, MPI_CHAR, 0, comm, &req));
  HVD_RETURN_IF_ERROR(Await(&req, timeout_s, "waiting for rank 0's rendezvous address"));
  msg[kMessageBytes - 1] = '\0';
  std::string text(msg + 1 + kSecretBytes);
  if (msg[0] != 1) return Status::Internal("rank 0 could not host the rendezvous store: " + text);
  job->secret.assign(msg + 1, kSecretBytes);
  job->store_addr = text;
  return Status::OK();
}

}  // namespace

Status MpiRendezvousImpl(double timeout_s, MpiJob* out) {
  *out = MpiJob{};
  HVD_RETURN_IF_ERROR(EnsureMpiInitialized());
  // Our own communicator: never mixes with the user's traffic on MPI_COMM_WORLD.
  MPI_Comm comm;
  MPI_Request req;
  HVD_MPI_CALL(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req));
  HVD_RETURN_IF_ERROR(Await(&req, timeout_s, "creating hvdlite's communicator"));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &out->rank);
  MPI_Comm_size(comm, &out->size);
  Status st = out->size > 1 ? Exchange(comm, timeout_s, out) : Status::OK();
  MPI_Comm_free(&comm);
  if (st.ok() && out->size > 1) {
    HVD_LOG(kDebug,
            "MPI rendezvous: rank " << out->rank << " of " << out->size << ", store at " << out->store_addr);
  }
  return st.WithContext("forming the job through MPI (rank " + std::to_string(out->rank) + ")");
}

}  // namespace hvdlite
