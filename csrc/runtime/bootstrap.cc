#include "runtime/bootstrap.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "backend/backend.h"
#include "common/crypto.h"
#include "common/logging.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"

namespace hvdlite {
namespace {

std::string HostOf(const std::string& addr) {
  auto colon = addr.rfind(':');
  std::string host = colon == std::string::npos ? addr : addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

// The local address the kernel would use to reach the store's host: the one
// peers on other hosts can reach us on. No packet is sent (UDP connect).
std::string RouteAddressTo(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0) return "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

// Identity of the machine this process runs on, compared between ranks to decide
// which of them share memory: the hostname (UTS namespace), the boot id (two
// machines with one name) and /dev/shm's device:inode (two mount namespaces on
// one kernel, e.g. containers, whose /dev/shm differ). A launcher's host label
// never enters it: ranks that cannot map each other's segments never try.
// HVDLITE_HOSTNAME replaces the whole identity.
std::string ThisHostId(const Config& cfg) {
  if (!cfg.HOSTNAME.empty()) return cfg.HOSTNAME;
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  std::ostringstream id;
  id << buf;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) id << "/" << boot_id;
  struct stat st{};
  if (stat("/dev/shm", &st) == 0) id << "/" << st.st_dev << ":" << st.st_ino;
  return id.str();
}

// The IPv4 address of the first interface in `names` (comma-separated) that is up
// and has one; "" when none has.
std::string InterfaceAddress(const std::string& names) {
  std::vector<std::string> wanted;
  std::stringstream ss(names);
  for (std::string n; std::getline(ss, n, ',');)
    if (!n.empty()) wanted.push_back(n);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (const auto& name : wanted) {
    for (ifaddrs* i = ifs; i != nullptr && out.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || name != i->ifa_name) continue;
      char addr[INET_ADDRSTRLEN];
      auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, addr, sizeof(addr)) != nullptr) out = addr;
    }
    if (!out.empty()) break;
  }
  freeifaddrs(ifs);
  return out;
}

// Local rank = position among the ranks on the same host; cross rank =
// position among the ranks with the same local rank (Horovod's definitions).
void ComputeTopology(const std::vector<std::string>& hosts, int rank, Topology* t) {
  std::map<std::string, std::vector<int>> by_host;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) by_host[hosts[r]].push_back(r);
  std::vector<int> local_rank_of(hosts.size());
  for (auto& kv : by_host)
    for (size_t i = 0; i < kv.second.size(); ++i) local_rank_of[kv.second[i]] = static_cast<int>(i);
  t->local_size = static_cast<int>(by_host[hosts[rank]].size());
  t->local_rank = local_rank_of[rank];
  std::vector<int> same_local;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r)
    if (local_rank_of[r] == t->local_rank) same_local.push_back(r);
  t->cross_size = static_cast<int>(same_local.size());
  for (size_t i = 0; i < same_local.size(); ++i)
    if (same_local[i] == rank) t->cross_rank = static_cast<int>(i);
}

Status ResolveIdentity(const Config& cfg, Topology* topo) {
  if (cfg.RANK < 0 && cfg.SIZE < 0) return Status::OK();  // a plain single-process run
  if (cfg.RANK < 0 || cfg.SIZE <= 0 || cfg.RANK >= cfg.SIZE) {
    return Status::InvalidArgument("HVDLITE_RANK=" + std::to_string(cfg.RANK) +
                                   " and HVDLITE_SIZE=" + std::to_string(cfg.SIZE) +
                                   " do not describe a job: set both, with "
                                   "0 <= rank < size (hvdliterun does this for you)");
  }
  topo->rank = static_cast<int>(cfg.RANK);
  topo->size = static_cast<int>(cfg.SIZE);
  return Status::OK();
}

// Rank, size, store address and secret: from the HVDLITE_* variables, or
// from MPI when an MPI launcher started us and those are unset.
Status ResolveJob(const Config& cfg, Topology* topo, std::string* store_addr, std::string* secret,
                  std::shared_ptr<void>* keepalive) {
  if (cfg.RANK < 0 && cfg.SIZE < 0 && cfg.mpi_launch.active()) {
    MpiJob job;
    HVD_RETURN_IF_ERROR(MpiRendezvous(cfg.START_TIMEOUT, &job));
    topo->rank = job.rank;
    topo->size = job.size;
    topo->via_mpi = true;
    *store_addr = job.store_addr;
    *secret = job.secret;
    if (keepalive) *keepalive = job.store_server;
    return Status::OK();
  }
  HVD_RETURN_IF_ERROR(ResolveIdentity(cfg, topo));
  *store_addr = cfg.STORE_ADDR;
  if (!HexDecode(cfg.SECRET, secret)) {
    return Status::InvalidArgument("HVDLITE_SECRET must be hex (hvdliterun sets it)");
  }
  return Status::OK();
}

// Every rank learns every rank's host id in O(N) store operations in all:
// each rank sets its own; rank 0 reads them all and publishes the list as one
// value (ids once each, then one index per rank); the others read that one
// value. (Each rank reading every key was N^2 round trips through the store.)
Status ExchangeHosts(Store* store, const std::string& prefix, int rank, int size, const std::string& mine,
                     double timeout_s, std::vector<std::string>* hosts) {
  hosts->assign(size, std::string());
  HVD_RETURN_IF_ERROR(store->Set(prefix + "host/" + std::to_string(rank), mine));
  std::string table;
  if (rank == 0) {
    std::map<std::string, int> index;
    std::string ids, of;
    for (int r = 0; r < size; ++r) {
      std::string id;
      HVD_RETURN_IF_ERROR(store->Get(prefix + "host/" + std::to_string(r), timeout_s, &id)
                              .WithContext("waiting for rank " + std::to_string(r) + " to join"));
      auto it = index.emplace(id, static_cast<int>(index.size()));
      if (it.second) ids += id + "\n";
      of += std::to_string(it.first->second) + " ";
    }
    table = std::to_string(index.size()) + "\n" + ids + of;
    HVD_RETURN_IF_ERROR(store->Set(prefix + "hosts", table));
  } else {
    HVD_RETURN_IF_ERROR(store->Get(prefix + "hosts", timeout_s, &table)
                            .WithContext("waiting for rank 0 to collect every rank's host"));
  }
  std::istringstream in(table);
  size_t count = 0;
  in >> count;
  in.ignore(1);
  std::vector<std::string> ids(count);
  for (auto& id : ids) std::getline(in, id);
  for (int r = 0; r < size; ++r) {
    size_t i = count;
    in >> i;
    if (i >= count) return Status::Internal("malformed host table in the rendezvous store");
    (*hosts)[r] = ids[i];
  }
  return Status::OK();
}

}  // namespace

Status Bootstrap(const Config& cfg, Topology* topo, std::unique_ptr<Transport>* transport,
                 std::shared_ptr<void>* keepalive, JobStore* job_store) {
  *topo = Topology{};
  std::string secret, store_addr;
  HVD_RETURN_IF_ERROR(ResolveJob(cfg, topo, &store_addr, &secret, keepalive));
  std::unique_ptr<Store> store;
  std::string advertise = "127.0.0.1";
  if (topo->size == 1) {
    store = NewMemoryStore();
  } else {
    if (store_addr.empty()) {
      return Status::InvalidArgument(
          "HVDLITE_STORE_ADDR is not set for a " + std::to_string(topo->size) +
          "-process job: launch with `hvdliterun -np N python script.py`, or have "
          "your launcher host a store and set HVDLITE_STORE_ADDR and HVDLITE_SECRET");
    }
    HVD_RETURN_IF_ERROR(ConnectTcpStore(store_addr, secret, cfg.START_TIMEOUT, &store));
    if (cfg.NETWORK_INTERFACES.empty()) {
      advertise = RouteAddressTo(HostOf(store_addr));
    } else {
      advertise = InterfaceAddress(cfg.NETWORK_INTERFACES);
      if (advertise.empty()) {
        return Status::InvalidArgument("HVDLITE_NETWORK_INTERFACES=" + cfg.NETWORK_INTERFACES +
                                       ": no interface of this host by that name has an IPv4 address");
      }
    }
  }
  // Each init() of a job (init after shutdown works) gets fresh keys.
  int64_t epoch = 0;
  HVD_RETURN_IF_ERROR(store->Add("hvdlite/epoch/" + std::to_string(topo->rank), 1, &epoch));
  const std::string prefix = "e" + std::to_string(epoch) + "/";
  std::vector<std::string> hosts;
  HVD_RETURN_IF_ERROR(
      ExchangeHosts(store.get(), prefix, topo->rank, topo->size, ThisHostId(cfg), cfg.START_TIMEOUT, &hosts));
  ComputeTopology(hosts, topo->rank, topo);
  std::map<std::string, int> host_index;
  topo->host_of.assign(hosts.size(), 0);
  for (size_t r = 0; r < hosts.size(); ++r) {
    auto it = host_index.emplace(hosts[r], static_cast<int>(host_index.size())).first;
    topo->host_of[r] = it->second;
  }
  if (cfg.LOCAL_RANK >= 0) topo->local_rank = static_cast<int>(cfg.LOCAL_RANK);
  if (cfg.LOCAL_SIZE > 0) topo->local_size = static_cast<int>(cfg.LOCAL_SIZE);
  if (cfg.CROSS_RANK >= 0) topo->cross_rank = static_cast<int>(cfg.CROSS_RANK);
  if (cfg.CROSS_SIZE > 0) topo->cross_size = static_cast<int>(cfg.CROSS_SIZE);
  if (topo->via_mpi && cfg.LOCAL_RANK < 0 && cfg.mpi_launch.local_rank >= 0 &&
      cfg.mpi_launch.local_size > 0) {
    topo->local_rank = static_cast<int>(cfg.mpi_launch.local_rank);  // the launcher's word
    topo->local_size = static_cast<int>(cfg.mpi_launch.local_size);
  }
  ShmOptions shm;
  shm.disable = cfg.SHM_DISABLE;
  shm.channel_bytes = static_cast<size_t>(std::max<int64_t>(cfg.SHM_CHANNEL_BYTES, 0));
  shm.spin_us = cfg.SPIN_US;
  shm.p2p_arena_bytes = static_cast<size_t>(std::max<int64_t>(cfg.P2P_ARENA_BYTES, 0));
  HVD_RETURN_IF_ERROR(CreateShmTransport(store.get(), prefix, topo->rank, topo->size, advertise, secret,
                                         cfg.START_TIMEOUT, cfg.TIMEOUT_SECONDS, hosts, shm, transport,
                                         static_cast<int>(cfg.LIVENESS_SECONDS)));
  if (job_store != nullptr) *job_store = JobStore{std::shared_ptr<Store>(std::move(store)), prefix};
  return Status::OK();
}

}  // namespace hvdlite
