#include "coordinator/messages.h"

#include <cstring>

namespace hvdlite {
namespace {

class Writer {
 public:
  explicit Writer(ControlKind kind) { U8(static_cast<uint8_t>(kind)); }
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void I32(int32_t v) { Raw(&v, 4); }
  void I64(int64_t v) { Raw(&v, 8); }
  void F64(double v) { Raw(&v, 8); }
  void Str(const std::string& s) {
    I32(static_cast<int32_t>(s.size()));
    out_.append(s);
  }
  void I64s(const std::vector<int64_t>& v) {
    I32(static_cast<int32_t>(v.size()));
    for (int64_t x : v) I64(x);
  }
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Reads with bounds checks; after the first overrun every read yields zeros
// and ok() turns false.
class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s), pos_(1) {}
  bool ok() const { return ok_; }
  uint8_t U8() {
    uint8_t v = 0;
    Raw(&v, 1);
    return v;
  }
  int32_t I32() {
    int32_t v = 0;
    Raw(&v, 4);
    return v;
  }
  int64_t I64() {
    int64_t v = 0;
    Raw(&v, 8);
    return v;
  }
  double F64() {
    double v = 0;
    Raw(&v, 8);
    return v;
  }
  std::string Str() {
    int32_t n = I32();
    if (!ok_ || n < 0 || static_cast<size_t>(n) > s_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::vector<int64_t> I64s() {
    int32_t n = I32();
    if (!ok_ || n < 0 || static_cast<size_t>(n) * 8 > s_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::vector<int64_t> v(n);
    for (auto& x : v) x = I64();
    return v;
  }
  bool AtEnd() const { return pos_ == s_.size(); }
  size_t Left() const { return s_.size() - pos_; }
  void Fail() { ok_ = false; }

 private:
  void Raw(void* p, size_t n) {
    if (!ok_ || n > s_.size() - pos_) {
      ok_ = false;
      return;
    }
    std::memcpy(p, s_.data() + pos_, n);
    pos_ += n;
  }
  const std::string& s_;
  size_t pos_;
  bool ok_ = true;
};

// A request's rank is not on the wire: its sender is known where it arrives
// (the relay's delivery, coordinator/relay.h), and so the lists of ranks that
// submit the same requests are equal bytes, which relays merge into one run.
void WriteRequest(Writer& w, const Request& r) {
  w.I32(r.cache_id);
  if (r.cache_id >= 0) return;  // the coordinator knows the rest
  w.I32(static_cast<int32_t>(r.type));
  w.Str(r.name);
  w.I32(static_cast<int32_t>(r.dtype));
  w.I64s(r.shape);
  w.I32(static_cast<int32_t>(r.op));
  w.I32(r.root);
  w.F64(r.prescale);
  w.F64(r.postscale);
  w.I32(r.process_set);
  w.I64s(r.splits);
  w.I32(r.device);
  w.I32(static_cast<int32_t>(r.set_members.size()));
  for (int32_t m : r.set_members) w.I32(m);
  w.I32(r.target_set);
}

Request ReadRequest(Reader& rd) {
  Request r;  // rank 0 until its receiver sets it (WriteRequest)
  r.cache_id = rd.I32();
  if (r.cache_id >= 0) return r;
  r.type = static_cast<OpType>(rd.I32());
  r.name = rd.Str();
  r.dtype = static_cast<DataType>(rd.I32());
  r.shape = rd.I64s();
  r.op = static_cast<ReduceOp>(rd.I32());
  r.root = rd.I32();
  r.prescale = rd.F64();
  r.postscale = rd.F64();
  r.process_set = rd.I32();
  r.splits = rd.I64s();
  r.device = rd.I32();
  int32_t members = rd.I32();
  if (members < 0 || static_cast<size_t>(members) > rd.Left() / 4) {
    rd.Fail();
    return r;
  }
  for (int32_t i = 0; i < members; ++i) r.set_members.push_back(rd.I32());
  r.target_set = rd.I32();
  return r;
}

void WriteResponses(Writer& w, const std::vector<Response>& responses) {
  w.I32(static_cast<int32_t>(responses.size()));
  for (const auto& r : responses) {
    w.I32(static_cast<int32_t>(r.type));
    w.I32(r.process_set);
    w.I32(static_cast<int32_t>(r.names.size()));
    for (size_t i = 0; i < r.names.size(); ++i) {
      w.Str(r.names[i]);
      w.I32(i < r.cache_ids.size() ? r.cache_ids[i] : -1);
    }
    w.I64s(r.first_dims);
    w.I64s(r.split_matrix);
    w.I32(r.new_set_id);
    w.I32(r.last_joined_rank);
    w.I32(static_cast<int32_t>(r.error_code));
    w.Str(r.error);
    w.I32(static_cast<int32_t>(r.specs.size()));
    for (const auto& spec : r.specs) {
      Request full = spec;
      full.cache_id = -1;
      WriteRequest(w, full);
    }
  }
}

Status ReadResponses(Reader& rd, size_t total, std::vector<Response>* out) {
  int32_t n = rd.I32();
  if (n < 0 || static_cast<size_t>(n) > total) return Status::Internal("corrupt response list");
  out->clear();
  for (int32_t i = 0; i < n && rd.ok(); ++i) {
    Response r;
    r.type = static_cast<OpType>(rd.I32());
    r.process_set = rd.I32();
    int32_t names = rd.I32();
    if (names < 0 || static_cast<size_t>(names) > total) return Status::Internal("corrupt response");
    for (int32_t j = 0; j < names && rd.ok(); ++j) {
      r.names.push_back(rd.Str());
      r.cache_ids.push_back(rd.I32());
    }
    r.first_dims = rd.I64s();
    r.split_matrix = rd.I64s();
    r.new_set_id = rd.I32();
    r.last_joined_rank = rd.I32();
    r.error_code = static_cast<StatusCode>(rd.I32());
    r.error = rd.Str();
    int32_t specs = rd.I32();
    if (specs < 0 || static_cast<size_t>(specs) > total) return Status::Internal("corrupt response");
    for (int32_t j = 0; j < specs && rd.ok(); ++j) r.specs.push_back(ReadRequest(rd));
    out->push_back(std::move(r));
  }
  return Status::OK();
}

}  // namespace

const char* OpTypeName(OpType t) {
  switch (t) {
    case OpType::kAllreduce:
      return "allreduce";
    case OpType::kAllgather:
      return "allgather";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kAlltoall:
      return "alltoall";
    case OpType::kReducescatter:
      return "reducescatter";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kAddProcessSet:
      return "add_process_set";
    case OpType::kRemoveProcessSet:
      return "remove_process_set";
    case OpType::kShutdown:
      return "shutdown";
    case OpType::kJoin:
      return "join";
    case OpType::kRecv:
      return "recv";
  }
  return "unknown";
}

bool Request::SameSignature(const Request& o) const {
  return type == o.type && name == o.name && dtype == o.dtype && shape == o.shape && op == o.op &&
         root == o.root && prescale == o.prescale && postscale == o.postscale &&
         process_set == o.process_set && splits == o.splits && device == o.device &&
         set_members == o.set_members && target_set == o.target_set;
}

std::string Serialize(const RequestList& list) {
  Writer w(ControlKind::kRequests);
  w.I64(list.cache_ack);
  w.I32(static_cast<int32_t>(list.requests.size()));
  for (const auto& r : list.requests) WriteRequest(w, r);
  w.U8(list.has_waits ? 1 : 0);
  if (!list.has_waits) return w.Take();
  w.I32(static_cast<int32_t>(list.waits.size()));
  for (const auto& caller : list.waits) {
    w.I32(static_cast<int32_t>(caller.size()));
    for (const WaitKey& k : caller) {
      w.I32(k.process_set);
      w.Str(k.name);
      w.I32(k.p2p_src);
      w.I32(k.tag);
    }
  }
  return w.Take();
}

std::string Serialize(const ResponseList& list) {
  Writer w(ControlKind::kResponses);
  w.U8(list.shutdown ? 1 : 0);
  w.I64(list.eviction_seq);
  w.I32(static_cast<int32_t>(list.evicted_cache_ids.size()));
  for (int32_t id : list.evicted_cache_ids) w.I32(id);
  WriteResponses(w, list.responses);
  w.I64(list.schedule_epoch);
  WriteResponses(w, list.schedule);
  return w.Take();
}

Status Deserialize(const std::string& bytes, RequestList* out) {
  if (PeekControlKind(bytes) != ControlKind::kRequests) return Status::Internal("not a request list");
  Reader rd(bytes);
  out->cache_ack = rd.I64();
  int32_t n = rd.I32();
  if (n < 0 || static_cast<size_t>(n) > bytes.size()) return Status::Internal("corrupt request list");
  out->requests.clear();
  for (int32_t i = 0; i < n && rd.ok(); ++i) out->requests.push_back(ReadRequest(rd));
  out->has_waits = rd.U8() != 0;
  out->waits.clear();
  if (out->has_waits) {
    int32_t callers = rd.I32();
    if (callers < 0 || static_cast<size_t>(callers) > rd.Left())
      return Status::Internal("corrupt request list");
    for (int32_t i = 0; i < callers && rd.ok(); ++i) {
      int32_t keys = rd.I32();
      if (keys < 0 || static_cast<size_t>(keys) > rd.Left()) return Status::Internal("corrupt request list");
      std::vector<WaitKey> caller;
      for (int32_t j = 0; j < keys && rd.ok(); ++j) {
        WaitKey k;
        k.process_set = rd.I32();
        k.name = rd.Str();
        k.p2p_src = rd.I32();
        k.tag = rd.I32();
        caller.push_back(std::move(k));
      }
      out->waits.push_back(std::move(caller));
    }
  }
  if (!rd.ok() || !rd.AtEnd()) return Status::Internal("corrupt request list");
  return Status::OK();
}

Status Deserialize(const std::string& bytes, ResponseList* out) {
  if (PeekControlKind(bytes) != ControlKind::kResponses) return Status::Internal("not a response list");
  Reader rd(bytes);
  out->shutdown = rd.U8() != 0;
  out->eviction_seq = rd.I64();
  int32_t evicted = rd.I32();
  if (evicted < 0 || static_cast<size_t>(evicted) > bytes.size())
    return Status::Internal("corrupt response list");
  out->evicted_cache_ids.clear();
  for (int32_t i = 0; i < evicted && rd.ok(); ++i) out->evicted_cache_ids.push_back(rd.I32());
  HVD_RETURN_IF_ERROR(ReadResponses(rd, bytes.size(), &out->responses));
  out->schedule_epoch = rd.I64();
  HVD_RETURN_IF_ERROR(ReadResponses(rd, bytes.size(), &out->schedule));
  if (!rd.ok() || !rd.AtEnd()) return Status::Internal("corrupt response list");
  return Status::OK();
}

// Wire format: kind, type, epoch, position, outcome, input size (uint32),
// then the payload to the end. One allocation per message.
constexpr size_t kVoteMessageHeader = 1 + 1 + 8 + 8 + 1 + 4;

namespace {
void WriteVoteHeader(const VoteMessage& m, char* header) {
  header[0] = static_cast<char>(ControlKind::kVote);
  header[1] = static_cast<char>(m.type);
  std::memcpy(header + 2, &m.epoch, 8);
  std::memcpy(header + 10, &m.position, 8);
  header[18] = static_cast<char>(m.outcome);
  std::memcpy(header + 19, &m.input_size, 4);
}

// Parses the header of `bytes` into *out (not the payload).
Status ReadVoteHeader(const std::string& bytes, VoteMessage* out) {
  if (bytes.size() < kVoteMessageHeader || PeekControlKind(bytes) != ControlKind::kVote)
    return Status::Internal("corrupt vote message");
  const char* p = bytes.data();
  const uint8_t type = static_cast<uint8_t>(p[1]);
  out->type = static_cast<VoteMessage::Type>(type);
  std::memcpy(&out->epoch, p + 2, 8);
  std::memcpy(&out->position, p + 10, 8);
  out->outcome = static_cast<uint8_t>(p[18]);
  std::memcpy(&out->input_size, p + 19, 4);
  const size_t payload = bytes.size() - kVoteMessageHeader;
  if (type > 3 || out->outcome > VoteMessage::kFail ||
      (out->input_size > 0 && payload % out->input_size != 0))
    return Status::Internal("corrupt vote message");
  return Status::OK();
}
}  // namespace

void SerializeWithRoom(Vote* vote, size_t input_size) {
  VoteMessage header;
  header.epoch = vote->epoch;
  header.position = vote->position;
  header.outcome = vote->ready     ? VoteMessage::kReady
                   : vote->barrier ? VoteMessage::kBarrier
                                   : VoteMessage::kExit;
  header.input_size = static_cast<uint32_t>(input_size);
  vote->wire.assign(kVoteMessageHeader + input_size, '\0');
  WriteVoteHeader(header, &vote->wire[0]);
  vote->input_offset = kVoteMessageHeader;
  vote->input_size = input_size;
}

bool RewriteVoteHeader(const VoteMessage& header, std::string* wire) {
  if (wire->size() < kVoteMessageHeader || PeekControlKind(*wire) != ControlKind::kVote) return false;
  WriteVoteHeader(header, &(*wire)[0]);
  return true;
}

std::string Serialize(const VoteMessage& m) { return Serialize(m, m.payload_data(), m.payload_size()); }

// The header is built apart and the payload appended once: no zero fill of
// the payload's bytes first (votes carry inputs on the small-message path).
std::string Serialize(const VoteMessage& m, const char* payload, size_t size) {
  char header[kVoteMessageHeader] = {};
  WriteVoteHeader(m, header);
  std::string wire;
  wire.reserve(kVoteMessageHeader + size);
  wire.append(header, kVoteMessageHeader);
  if (size > 0) wire.append(payload, size);
  return wire;
}

Status Deserialize(const std::string& bytes, VoteMessage* out) {
  HVD_RETURN_IF_ERROR(ReadVoteHeader(bytes, out));
  out->payload.assign(bytes.data() + kVoteMessageHeader, bytes.size() - kVoteMessageHeader);
  out->payload_offset = 0;
  return Status::OK();
}

Status Deserialize(std::string&& bytes, VoteMessage* out) {
  HVD_RETURN_IF_ERROR(ReadVoteHeader(bytes, out));
  out->payload = std::move(bytes);
  out->payload_offset = kVoteMessageHeader;
  return Status::OK();
}

ControlKind PeekControlKind(const std::string& bytes) {
  return bytes.empty() ? ControlKind{0} : static_cast<ControlKind>(static_cast<uint8_t>(bytes[0]));
}

}  // namespace hvdlite
