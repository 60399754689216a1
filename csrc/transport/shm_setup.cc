// AddSharedMemory (CreateShmTransport's second half; transport.cc builds the
// base transport first): the shared-memory segment exchange between the ranks
// of this host.
//
// Partners. Shared memory links only the pairs of this host's members that
// the algorithms use (HostPartners: ring neighbours, recursive-doubling and
// binomial-tree partners, the non-power-of-two fold), at most about
// 2 + log2(local size) per member, and a member's rings share a fixed budget
// (kShmBudgetBytes), so a host's shared memory grows with its ranks, not with
// its pairs. Other pairs of the host talk over TCP.
//
// Protocol, through the store, between partners (local order = ascending
// global rank; the partner relation is symmetric):
//  1. each member creates its segment "/hvdlite-<job tag>-<prefix>r<rank>"
//     (job tag: 16 hex digits of HMAC-SHA256(secret, "hvdlite-shm-segment"),
//     so jobs never collide and a launcher that knows the secret can find any
//     leftover) with one channel pair per partner, and publishes
//     "<prefix>shm/seg/<rank>" = "<name> <nonce hex>", or "" when it could
//     not create one;
//  2. it maps every partner's segment, checking the nonce, and publishes
//     "<prefix>shm/ok/<rank>" = one '1' or '0' per partner: mapped or not;
//  3. it reads every partner's ok string; the pair (me, q) uses shared memory
//     iff I mapped q's segment and q mapped mine. Every partner has finished
//     step 2 by then, so it unlinks its own segment's name: from here on the
//     memory lives only as long as the mappings.
// Store traffic and mappings per member: O(partners), not O(local size).
// A failure to create or map is a warning and that pair falls back to TCP;
// a store timeout (a member never got here) fails the whole setup, and the
// segment is unlinked on that path too (shm::Segment's destructor).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/crypto.h"
#include "common/logging.h"
#include "rendezvous/store.h"
#include "transport/shm_transport.h"

namespace hvdlite {
namespace {

// "" when libcrypto's HMAC failed (the rank then has no segment: TCP to this host's ranks).
std::string SegmentName(const std::string& secret, const std::string& prefix, int rank) {
  Digest256 d;
  if (!HmacSha256(secret, "hvdlite-shm-segment", &d)) return "";
  std::string safe;
  for (char c : prefix) safe += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return "/hvdlite-" + HexEncode(d.data(), 8) + "-" + safe + "r" + std::to_string(rank);
}

struct HostPlan {
  std::vector<int> members;   // global ranks on this host, ascending
  int me = -1;                // my index in members
  std::vector<int> partners;  // indices into members, ascending (HostPartners)
};

HostPlan PlanHost(const std::vector<std::string>& hosts, int rank) {
  HostPlan p;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    if (hosts[r] != hosts[rank]) continue;
    if (r == rank) p.me = static_cast<int>(p.members.size());
    p.members.push_back(r);
  }
  p.partners = HostPartners(p.me, static_cast<int>(p.members.size()));
  return p;
}

// Index of partner `peer` in the partner list of `owner` (both local indices):
// the channel pair serving it in owner's segment.
uint32_t PairSlot(int owner, int local_size, int peer) {
  const std::vector<int> list = HostPartners(owner, local_size);
  return static_cast<uint32_t>(std::lower_bound(list.begin(), list.end(), peer) - list.begin());
}

// A data ring per partner, sharing kShmBudgetBytes, at most opts.channel_bytes each.
size_t ChannelBytesFor(const ShmOptions& opts, size_t partners) {
  const size_t share = kShmBudgetBytes / std::max<size_t>(partners, 1);
  return std::min(opts.channel_bytes, std::max(kShmMinChannelBytes, share));
}

// Step 1: create and publish this rank's segment ("" when that failed).
Status PublishOwn(Store* store, const std::string& prefix, const std::string& secret, int rank,
                  const HostPlan& plan, const ShmOptions& opts, shm::Segment* own) {
  uint64_t nonce[2] = {0, 0};
  const std::string name = RandomBytes(nonce, sizeof(nonce)) ? SegmentName(secret, prefix, rank) : "";
  const uint32_t pairs = static_cast<uint32_t>(plan.partners.size());
  shm::Geometry geometry = shm::MakeGeometry(ChannelBytesFor(opts, plan.partners.size()));
  geometry.arena_bytes = shm::RoundUp(opts.p2p_arena_bytes, shm::kArenaAlign);
  Status st = name.empty() ? Status::Internal("libcrypto failed (random bytes or HMAC) naming the segment")
                           : shm::Segment::Create(name, geometry, pairs, rank, nonce, own);
  if (!st.ok())
    HVD_LOG(kWarning, "shared memory unavailable, using TCP to this host's ranks: " << st.message());
  std::string value = own->mapped() ? name + " " + HexEncode(nonce, sizeof(nonce)) : "";
  return store->Set(prefix + "shm/seg/" + std::to_string(rank), value);
}

// Step 2: map every partner's segment; publish which ones worked (one
// character per partner, '0' for all when this rank has no segment itself).
Status MapPeers(Store* store, const std::string& prefix, const HostPlan& plan, double timeout_s,
                const shm::Segment& own, std::vector<shm::Segment>* mapped) {
  std::string ok(plan.partners.size(), '0');
  for (size_t j = 0; j < plan.partners.size(); ++j) {
    const int q = plan.members[plan.partners[j]];
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
    ok[j] = own.mapped() ? '1' : '0';
  }
  return store->Set(prefix + "shm/ok/" + std::to_string(plan.members[plan.me]), ok);
}

// Step 3: which pairs both sides mapped. Builds the links for those.
Status LinkPeers(Store* store, const std::string& prefix, const HostPlan& plan, double timeout_s,
                 const shm::Segment& own, const std::vector<shm::Segment>& mapped,
                 std::vector<ShmTransport::Link>* links) {
  const shm::Geometry& mine = own.mapped() ? own.header()->geometry : shm::Geometry();
  const int local_size = static_cast<int>(plan.members.size());
  for (size_t j = 0; j < plan.partners.size(); ++j) {
    const int i = plan.partners[j];
    const int q = plan.members[i];
    std::string ok;
    HVD_RETURN_IF_ERROR(store->Get(prefix + "shm/ok/" + std::to_string(q), timeout_s, &ok)
                            .WithContext("waiting for rank " + std::to_string(q) + " to map shared memory"));
    const uint32_t in_k = PairSlot(i, local_size, plan.me);  // my slot in q's segment
    const bool both = own.mapped() && mapped[q].mapped() && in_k < ok.size() && ok[in_k] == '1';
    if (!both) continue;
    const shm::Geometry& theirs = mapped[q].header()->geometry;
    const uint32_t out_k = static_cast<uint32_t>(j);
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

std::vector<int> HostPartners(int me, int local_size) {
  std::vector<int> out;
  if (local_size < 2 || me < 0 || me >= local_size) return out;
  out.push_back((me + 1) % local_size);
  out.push_back((me + local_size - 1) % local_size);
  int p2 = 1;
  while (p2 * 2 <= local_size) p2 *= 2;
  for (int bit = 1; bit < p2; bit <<= 1) {
    if ((me ^ bit) < local_size) out.push_back(me ^ bit);
  }
  if (me >= p2) out.push_back(me - p2);
  if (me + p2 < local_size) out.push_back(me + p2);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), me), out.end());
  return out;
}

std::vector<int> ShmPartnerRanks(const std::vector<std::string>& hosts, int rank) {
  const HostPlan plan = PlanHost(hosts, rank);
  std::vector<int> out;
  for (int i : plan.partners) out.push_back(plan.members[i]);
  return out;
}

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
  if (opts.disable || plan.partners.empty()) {
    *out = std::move(base);
    return Status::OK();
  }
  shm::Segment own;
  std::vector<shm::Segment> mapped(size);
  std::vector<ShmTransport::Link> links(size);
  HVD_RETURN_IF_ERROR(PublishOwn(store, prefix, secret, rank, plan, opts, &own));
  HVD_RETURN_IF_ERROR(MapPeers(store, prefix, plan, connect_timeout_s, own, &mapped));
  HVD_RETURN_IF_ERROR(LinkPeers(store, prefix, plan, connect_timeout_s, own, mapped, &links));
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
  HVD_LOG(kDebug, "shared memory with " << linked << " of " << plan.partners.size()
                                        << " partners on this host"
                                        << (oversubscribed ? " (more ranks than cores: waits yield)" : ""));
  out->reset(new ShmTransport(std::move(base), std::move(own), std::move(mapped), std::move(links), opts,
                              io_timeout_s, oversubscribed));
  return Status::OK();
}

}  // namespace hvdlite
