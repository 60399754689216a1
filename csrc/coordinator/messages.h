// Negotiation messages: what a rank tells the coordinator it is ready to run
// (Request), and what the coordinator tells the members to run, in order
// (Response). Serialized to a compact little-endian byte string for the
// Transport's control plane.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {

enum class OpType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kAddProcessSet = 6,     // negotiated on the global set, or among its members (kAmongMembers);
                          // Request::set_members lists members
  kRemoveProcessSet = 7,  // negotiated on the global set, or on the set itself (among its members
                          // only: process_set == target_set); Request::target_set is the set id
  kShutdown = 8,          // internal: this rank is leaving
  kJoin = 9,              // this rank has no more data; it joins others' collectives with identity values
  // Only in a deadlock's error response to a rank blocked in a point-to-point
  // receive (runtime/p2p.h): names[0] is the receiving tensor, first_dims
  // {source's global rank, tag}. Receives are never negotiated.
  kRecv = 10,
};
const char* OpTypeName(OpType t);

// Request::process_set of an add_process_set negotiated among the new set's members only (torch
// builds a subgroup's backend on its members alone): the coordinator stages the set under a fresh
// id while its members submit, and the response travels under this marker to the members only.
constexpr int32_t kAmongMembers = -1;

struct Request {
  int32_t rank = 0;
  OpType type = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;  // broadcast: root (global rank)
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t process_set = 0;
  std::vector<int64_t> splits;       // alltoall: rows sent to each member (empty = even split)
  int32_t device = -1;               // CUDA device of the data, -1 = host memory
  std::vector<int32_t> set_members;  // add_process_set: the new set's global ranks
  int32_t target_set = -1;           // remove_process_set: the set to remove
  // When >= 0 the request was sent as just (rank, cache_id): the coordinator
  // restores the rest from its cache.
  int32_t cache_id = -1;

  // True when every field that must agree across submissions is equal.
  bool SameSignature(const Request& o) const;
};

struct Response {
  OpType type = OpType::kAllreduce;
  int32_t process_set = 0;
  std::vector<std::string> names;  // fused tensors, in execution order
  // Per name: the cache id every member now associates with it (-1 = none).
  std::vector<int32_t> cache_ids;
  // allgather: first dimension of each member (one tensor per response).
  std::vector<int64_t> first_dims;
  // alltoall: the members x members matrix of rows sent, row-major by sender.
  std::vector<int64_t> split_matrix;
  int32_t new_set_id = -1;        // add_process_set: the id the new set gets
  int32_t last_joined_rank = -1;  // join: the last rank to join (what join() returns)
  StatusCode error_code = StatusCode::kOk;
  std::string error;
  // Set only while some members have joined: one request per name, so a
  // joined member (which submitted nothing) knows dtype, shape and op.
  std::vector<Request> specs;
};

// A tensor some blocked caller waits for: (process set, name), or, when
// p2p_src >= 0, a point-to-point receive of tensor `name` in that set from
// global rank p2p_src with `tag` (only that rank's send can complete it).
struct WaitKey {
  int32_t process_set = 0;
  std::string name;
  int32_t p2p_src = -1;
  int32_t tag = 0;
  bool operator<(const WaitKey& o) const {
    if (process_set != o.process_set) return process_set < o.process_set;
    if (name != o.name) return name < o.name;
    return p2p_src != o.p2p_src ? p2p_src < o.p2p_src : tag < o.tag;
  }
  bool operator==(const WaitKey& o) const {
    return process_set == o.process_set && name == o.name && p2p_src == o.p2p_src && tag == o.tag;
  }
};

// A rank's callers blocked in a wait, one entry each: the tensors that caller
// waits for (all of them). Empty: the rank is not blocked.
using RankWaits = std::vector<std::vector<WaitKey>>;

struct RequestList {
  std::vector<Request> requests;
  // The highest cache eviction sequence number this rank has applied
  // (ResponseList::eviction_seq); the coordinator then drops retired ids.
  int64_t cache_ack = 0;
  // When has_waits: this rank's blocked callers as of the requests above (the
  // deadlock detector's input, coordinator/deadlock.h); replaces the previous
  // report. Sent only when it changed.
  bool has_waits = false;
  RankWaits waits;
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;  // every rank asked to shut down: leave the loop
  // Cache ids the coordinator evicted: the rank forgets them once it has
  // executed `responses`, and acknowledges `eviction_seq` (RequestList::cache_ack).
  std::vector<int32_t> evicted_cache_ids;
  int64_t eviction_seq = 0;
  // Steady state (coordinator/steady_state.h): when not empty, the coordinator
  // announces a learned schedule, numbered `schedule_epoch`: the groups every
  // rank runs, in this order and repeating, without asking it, from the end of
  // this list on. Sent to every rank in the same Drain, after the same responses.
  int64_t schedule_epoch = 0;
  std::vector<Response> schedule;
};

// This rank's own vote at one position of a steady-state schedule: ready (its
// caller submitted the position's group, unchanged), barrier, or exit (it
// submitted something else: every rank falls back to negotiation). It travels
// the vote tree inside VoteMessages (steady_state.h).
struct Vote {
  int64_t epoch = 0;
  int64_t position = 0;
  bool ready = false;
  bool barrier = false;  // (with ready false) a barrier vote, not an exit (steady_state.h)
  // A ready vote for a small CPU allreduce group may carry the voter's packed,
  // prescaled input (steady_state.h, "Votes that carry the data"): bytes
  // [input_offset, input_offset + input_size) of `wire`, a buffer the packing
  // writes into (SerializeWithRoom). input_size 0: none.
  std::string wire;
  size_t input_offset = 0;
  size_t input_size = 0;
  const char* input() const { return wire.data() + input_offset; }
};

// What travels the binomial vote tree (steady_state.h, "The vote tree"):
// kReport up (a whole subtree's outcome, or exit as soon as one is known),
// kDecision down (rank 0's outcome for every rank), kStalled up (a subtree has
// waited for votes past the stall delay; payload: its ranks known not to have
// voted, int32 each) and kWake down (votes are being cast: idle ranks start
// their patience).
struct VoteMessage {
  enum class Type : uint8_t { kReport = 0, kDecision = 1, kStalled = 2, kWake = 3 };
  static constexpr uint8_t kExit = 0, kReady = 1, kBarrier = 2, kFail = 3;  // outcomes
  Type type = Type::kReport;
  int64_t epoch = 0;
  int64_t position = 0;
  uint8_t outcome = kExit;  // kFail only in a decision: rank 0 gave up waiting (payload: why)
  // Ready with inputs: payload holds the inputs of consecutive ranks (the
  // subtree's, or every rank's in a decision), input_size bytes each.
  uint32_t input_size = 0;
  // The payload is payload[payload_offset, end): a message parsed from a
  // moved wire keeps the whole wire here (offset = its header), so receiving
  // copies nothing; one built to be sent has offset 0.
  std::string payload;
  size_t payload_offset = 0;
  const char* payload_data() const { return payload.data() + payload_offset; }
  size_t payload_size() const { return payload.size() - payload_offset; }
};

std::string Serialize(const RequestList& list);
std::string Serialize(const ResponseList& list);
// Parse failures are Internal errors (a peer speaking another protocol version).
Status Deserialize(const std::string& bytes, RequestList* out);
Status Deserialize(const std::string& bytes, ResponseList* out);
// Sets vote->wire to a VoteMessage (kReport of the vote's epoch, position and
// outcome) with room for an input of `input_size` bytes at vote->input_offset,
// for the caller to write: a leaf of the vote tree sends it as it is.
void SerializeWithRoom(Vote* vote, size_t input_size);
// Rewrites the header of a wire made by SerializeWithRoom (same payload); false
// when `wire` is not one (too short, or another kind).
bool RewriteVoteHeader(const VoteMessage& header, std::string* wire);
std::string Serialize(const VoteMessage& message);
// The same with `size` bytes at `payload` as the payload (header.payload unused): no copy of it first.
std::string Serialize(const VoteMessage& header, const char* payload, size_t size);
// A vote message: the const& form copies the payload out (payload_offset 0);
// the && form keeps the whole wire in out->payload (payload_offset: the header).
Status Deserialize(const std::string& bytes, VoteMessage* out);
Status Deserialize(std::string&& bytes, VoteMessage* out);

// First byte of every control payload says which kind it is.
// kP2pChunk and kP2pAck carry point-to-point messages (runtime/p2p.h); kRelay
// carries requests and responses along the vote tree (coordinator/relay.h).
enum class ControlKind : uint8_t {
  kRequests = 1,
  kResponses = 2,
  kVote = 3,
  kP2pChunk = 4,
  kP2pAck = 5,
  kRelay = 6,
  kP2pDeviceReady = 7,  // point-to-point of CUDA tensors (runtime/p2p_device.cc)
  kP2pDeviceReply = 8,
  kP2pDeviceGo = 9,
  kP2pArenaChunk = 10,  // point-to-point through shared memory (runtime/p2p_arena.h)
  kP2pArenaFree = 11
};
ControlKind PeekControlKind(const std::string& bytes);

}  // namespace hvdlite
