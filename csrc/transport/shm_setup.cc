// AddSharedMemory (CreateShmTransport's second half; transport.cc builds the
// base transport first): the shared-memory segment exchange between the ranks
// of this host.
//
// Protocol, through the store, among the members of this host (local order =
// ascending global rank):
//  1. each member creates its segment "/hvdlite-<job tag>-<prefix>r<rank>"
//     (job tag: 16 hex digits of HMAC-SHA256(secret, "hvdlite-shm-segment"),
//     so jobs never collide and a launcher that knows the secret can find any
//     leftover) and publishes "<prefix>shm/seg/<rank>" = "<name> <nonce hex>",
//     or "" when it could not create one;
//  2. it maps every other member's segment, checking the nonce, and publishes
//     "<prefix>shm/ok/<rank>" = one '1' or '0' per local member: mapped or not;
//  3. it reads every member's ok string; the pair (me, q) uses shared memory
//     iff I mapped q's segment and q mapped mine. Every member has finished
//     step 2 by then, so it unlinks its own segment's name: from here on the
//     memory lives only as long as the mappings.
// A failure to create or map is a warning and that pair falls back to TCP;
// a store timeout (a member never got here) fails the whole setup, and the
// segment is unlinked on that path too (shm::Segment's destructor).
#include <unistd.h>

#include <cctype>
#include <cstring>

#include "common/logging.h"
#include "common/sha256.h"
#include "rendezvous/store.h"
#include "transport/shm_transport.h"

namespace hvdlite {
namespace {

std::string SegmentName(const std::string& secret, const std::string& prefix, int rank) {
  const Digest256 d = HmacSha256(secret, "hvdlite-shm-segment");
  std::string safe;
  for (char c : prefix) safe += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return "/hvdlite-" + HexEncode(d.data(), 8) + "-" + safe + "r" + std::to_string(rank);
}

struct HostPlan {
  std::vector<int> members;  // global ranks on this host, ascending
  int me = -1;               // my index in members
};

HostPlan PlanHost(const std::vector<std::string>& hosts, int rank) {
  HostPlan p;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    if (hosts[r] != hosts[rank]) continue;
    if (r == rank) p.me = static_cast<int>(p.members.size());
    p.members.push_back(r);
  }
  return p;
}

// Step 1: create and publish this rank's segment ("" when that failed).
Status PublishOwn(Store* store, const std::string& prefix, const std::string& secret, int rank,
                  const HostPlan& plan, const ShmOptions& opts, shm::Segment* own) {
  uint64_t nonce[2] = {0, 0};
  RandomBytes(nonce, sizeof(nonce));
  const std::string name = SegmentName(secret, prefix, rank);
  const uint32_t pairs = static_cast<uint32_t>(plan.members.size() - 1);
  Status st = shm::Segment::Create(name, shm::MakeGeometry(opts.channel_bytes), pairs, rank, nonce, own);
  if (!st.ok())
    HVD_LOG(kWarning, "shared memory unavailable, using TCP to this host's ranks: " << st.message());
  std::string value = own->mapped() ? name + " " + HexEncode(nonce, sizeof(nonce)) : "";
  return store->Set(prefix + "shm/seg/" + std::to_string(rank), value);
}

// Step 2: map every other member's segment; publish which ones worked.
Status MapPeers(Store* store, const std::string& prefix, int rank, const HostPlan& plan, double timeout_s,
                const shm::Segment& own, std::vector<shm::Segment>* mapped) {
  std::string ok(plan.members.size(), '0');
  ok[plan.me] = own.mapped() ? '1' : '0';
  for (size_t i = 0; i < plan.members.size(); ++i) {
    const int q = plan.members[i];
    if (q == rank) continue;
    std::string value, nonce_bytes;
    HVD_RETURN_IF_ERROR(
        store->Get(prefix + "shm/seg/" + std::to_string(q), timeout_s, &value)
            .WithContext("waiting for rank " + std::to_string(q) + "'s shared-memory segment"));
    const size_t space = value.find(' ');
    if (value.empty() || space == std::string::npos || !HexDecode(value.substr(space + 1), &nonce_bytes) ||
        nonce_bytes.size() != 16) {
      continue;  // q has no segment: TCP with q
    }
    uint64_t nonce[2];
    std::memcpy(nonce, nonce_bytes.data(), sizeof(nonce));
    Status st = shm::Segment::Open(value.substr(0, space), q, nonce, &(*mapped)[q]);
    if (!st.ok()) {
      HVD_LOG(kWarning, "cannot map rank " << q << "'s shared memory, using TCP to it: " << st.message());
      continue;
    }
    ok[i] = '1';
  }
  return store->Set(prefix + "shm/ok/" + std::to_string(rank), ok);
}

// Step 3: which pairs both sides mapped. Builds the links for those.
Status LinkPeers(Store* store, const std::string& prefix, int rank, const HostPlan& plan, double timeout_s,
                 const shm::Segment& own, const std::vector<shm::Segment>& mapped,
                 std::vector<ShmTransport::Link>* links) {
  const shm::Geometry& mine = own.mapped() ? own.header()->geometry : shm::Geometry();
  for (size_t i = 0; i < plan.members.size(); ++i) {
    const int q = plan.members[i];
    if (q == rank) continue;
    std::string ok;
    HVD_RETURN_IF_ERROR(store->Get(prefix + "shm/ok/" + std::to_string(q), timeout_s, &ok)
                            .WithContext("waiting for rank " + std::to_string(q) + " to map shared memory"));
    const bool both =
        own.mapped() && mapped[q].mapped() && ok.size() == plan.members.size() && ok[plan.me] == '1';
    if (!both) continue;
    const shm::Geometry& theirs = mapped[q].header()->geometry;
    const uint32_t out_k = shm::PairIndex(plan.me, static_cast<int>(i));
    const uint32_t in_k = shm::PairIndex(static_cast<int>(i), plan.me);
    ShmTransport::Link& l = (*links)[q];
    l.linked = true;
    l.ctrl_out = shm::Producer(shm::ControlChannel(own.base(), mine, out_k));
    l.data_out = shm::Producer(shm::DataChannel(own.base(), mine, out_k));
    l.ctrl_in = shm::Consumer(shm::ControlChannel(mapped[q].base(), theirs, in_k));
    l.data_in = shm::Consumer(shm::DataChannel(mapped[q].base(), theirs, in_k));
    l.peer_sleeping = &mapped[q].header()->sleeping;
  }
  return Status::OK();
}

}  // namespace

Status AddSharedMemory(std::unique_ptr<SteppedTransport> base, Store* store, const std::string& prefix,
                       const std::string& secret, double connect_timeout_s, double io_timeout_s,
                       const std::vector<std::string>& hosts, const ShmOptions& opts,
                       std::unique_ptr<Transport>* out) {
  const int rank = base->rank(), size = base->size();
  if (static_cast<int>(hosts.size()) != size) {
    return Status::InvalidArgument("CreateShmTransport: " + std::to_string(hosts.size()) +
                                   " host names for " + std::to_string(size) + " ranks");
  }
  const HostPlan plan = PlanHost(hosts, rank);
  if (opts.disable || plan.members.size() < 2) {
    *out = std::move(base);
    return Status::OK();
  }
  shm::Segment own;
  std::vector<shm::Segment> mapped(size);
  std::vector<ShmTransport::Link> links(size);
  HVD_RETURN_IF_ERROR(PublishOwn(store, prefix, secret, rank, plan, opts, &own));
  HVD_RETURN_IF_ERROR(MapPeers(store, prefix, rank, plan, connect_timeout_s, own, &mapped));
  HVD_RETURN_IF_ERROR(LinkPeers(store, prefix, rank, plan, connect_timeout_s, own, mapped, &links));
  own.Unlink();
  int linked = 0;
  for (const auto& l : links) linked += l.linked ? 1 : 0;
  if (linked == 0) {
    *out = std::move(base);
    return Status::OK();
  }
  for (int q = 0; q < size; ++q) {
    if (!links[q].linked) mapped[q] = shm::Segment();  // unmap what is not used
  }
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const bool oversubscribed = cpus > 0 && static_cast<long>(plan.members.size()) > cpus;
  HVD_LOG(kDebug, "shared memory with " << linked << " of " << plan.members.size() - 1 << " local peers"
                                        << (oversubscribed ? " (more ranks than cores: waits yield)" : ""));
  out->reset(new ShmTransport(std::move(base), std::move(own), std::move(mapped), std::move(links), opts,
                              io_timeout_s, oversubscribed));
  return Status::OK();
}

}  // namespace hvdlite
