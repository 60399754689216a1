#include "coordinator/response_lists.h"

#include <algorithm>
#include <map>
#include <utility>

namespace hvdlite {
namespace {

// Marks in cuts[] where membership in the ascending `ranks` changes between
// rank r-1 and r (cuts has world size + 1 entries).
void MarkCuts(const std::vector<int>& ranks, std::vector<uint8_t>* cuts) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 0 || ranks[i] != ranks[i - 1] + 1) (*cuts)[ranks[i]] = 1;
    if (i + 1 == ranks.size() || ranks[i + 1] != ranks[i] + 1) (*cuts)[ranks[i] + 1] = 1;
  }
}

bool Has(const std::vector<int>& ranks, int r) { return std::binary_search(ranks.begin(), ranks.end(), r); }

void SortRanks(std::vector<int>* ranks) {
  if (!std::is_sorted(ranks->begin(), ranks->end())) std::sort(ranks->begin(), ranks->end());
}

}  // namespace

std::string FusionKey(const Request& r) {
  struct {
    int32_t set, dtype, op, device;  // CPU and CUDA tensors never fuse together
    double prescale, postscale;
  } k{r.process_set, static_cast<int32_t>(r.dtype), static_cast<int32_t>(r.op), r.device, r.prescale,
      r.postscale};
  return std::string(reinterpret_cast<const char*>(&k), sizeof(k));
}

int64_t TensorBytes(const Request& r) {
  int64_t n = 1;
  for (int64_t d : r.shape) n *= d;
  return n * static_cast<int64_t>(DataTypeSize(r.dtype));
}

std::vector<DecidedResponse> Fuse(std::deque<DecidedResponse>* decided, int64_t threshold) {
  std::vector<DecidedResponse> out;
  std::map<std::string, std::pair<size_t, int64_t>> open;  // key -> (index in out, bytes)
  for (auto& d : *decided) {
    if (!d.fusion_key.empty() && d.response.error_code == StatusCode::kOk) {
      auto it = open.find(d.fusion_key);
      if (it != open.end() && it->second.second + d.bytes <= threshold) {
        Response& target = out[it->second.first].response;
        target.names.push_back(d.response.names[0]);
        target.cache_ids.push_back(d.response.cache_ids[0]);
        it->second.second += d.bytes;
        continue;
      }
      open[d.fusion_key] = {out.size(), d.bytes};
    }
    out.push_back(std::move(d));
  }
  decided->clear();
  return out;
}

std::vector<ListRun> BuildListRuns(int world_size, std::vector<DecidedResponse>* fused,
                                   std::vector<CacheEviction>* evictions, int64_t eviction_seq,
                                   bool shutdown) {
  std::vector<uint8_t> cuts(world_size + 1, 0);
  cuts[0] = 1;
  for (auto& d : *fused) {
    SortRanks(&d.recipients);
    MarkCuts(d.recipients, &cuts);
  }
  for (auto& ev : *evictions) {
    SortRanks(&ev.ranks);
    MarkCuts(ev.ranks, &cuts);
  }
  std::vector<ListRun> runs;
  for (int lo = 0; lo < world_size;) {
    int hi = lo + 1;
    while (hi < world_size && !cuts[hi]) ++hi;
    ListRun run{lo, hi, {}};
    for (const auto& d : *fused) {
      if (Has(d.recipients, lo)) run.list.responses.push_back(d.response);
    }
    for (const auto& ev : *evictions) {
      if (Has(ev.ranks, lo)) run.list.evicted_cache_ids.push_back(ev.id);
    }
    run.list.eviction_seq = eviction_seq;
    run.list.shutdown = shutdown;
    runs.push_back(std::move(run));
    lo = hi;
  }
  return runs;
}

}  // namespace hvdlite
