// Bootstrap: from the Config (launcher environment) to a connected job:
// rank/size, the local/cross topology, and the transport mesh (shared memory
// between ranks on the same host unless HVDLITE_SHM_DISABLE, TCP otherwise).
// Blocking, bounded by HVDLITE_START_TIMEOUT.
//
// Three ways in: HVDLITE_RANK/SIZE/STORE_ADDR/SECRET (hvdliterun or any
// launcher that sets them) win; else an MPI launcher's variables
// (Config::mpi_launch) mean the job forms through MPI (MpiRendezvous: rank
// and size from MPI_COMM_WORLD, rank 0 hosts the store); else a 1-process job.
#pragma once
#include <memory>

#include "common/config.h"
#include "common/status.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

namespace hvdlite {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  bool via_mpi = false;  // the job was formed through MPI (started by mpirun)
  // host_of[r]: index of global rank r's machine (real identity, see ThisHostId),
  // numbered by first appearance in rank order; what two-level collectives group by.
  std::vector<int> host_of{0};
};

// The job's store client, kept for the job's lifetime after the bootstrap
// (the NCCL module's set-up uses it), and the prefix of this init()'s keys.
struct JobStore {
  std::shared_ptr<Store> store;
  std::string prefix;
};

// `keepalive` (may be null) receives what must outlive the bootstrap for the
// job's lifetime: under MPI, rank 0's store server. `job_store` (may be null)
// receives the store client.
Status Bootstrap(const Config& cfg, Topology* topo, std::unique_ptr<Transport>* transport,
                 std::shared_ptr<void>* keepalive = nullptr, JobStore* job_store = nullptr);

}  // namespace hvdlite
