// AllocateOutput / FreeOutput (handles.h): buffers the core allocates for
// outputs whose size only the job knows (allgather, alltoall, reducescatter)
// and hands to the caller, who frees them from any thread.
//
// Fresh memory is expensive to fill: the kernel faults it in page by page
// (64 MiB of new 4 KiB pages took ~20 ms here, as long as the collective that
// fills it; malloc trims and re-faults even 512 KiB blocks on every call). A
// training loop gathers the same sizes step after step, so buffers of
// kPooledMin bytes or more go back to a small process-wide pool when freed
// and are handed out again for an output of a size between half their
// capacity and their capacity. The pool keeps at most kPoolBytes; beyond
// that, freed buffers go back to the system.
//
// Every buffer carries a 64-byte header in front (its capacity), so the
// pointer handed out stays 64-byte aligned and FreeOutput knows the size.
// Thread-safety: a mutex guards the pool.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

#include "runtime/handles.h"

namespace hvdlite {
namespace {

constexpr size_t kHeader = 64;
constexpr size_t kPooledMin = 64 << 10;
constexpr size_t kPoolBytes = 256 << 20;

struct Pool {
  std::mutex mu;
  std::multimap<size_t, char*> free;  // capacity -> header address
  size_t bytes = 0;
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: outputs may be freed during interpreter exit
  return *pool;
}

size_t& CapacityOf(char* header) { return *reinterpret_cast<size_t*>(header); }

char* FromPool(size_t size) {
  Pool& pool = ThePool();
  std::lock_guard<std::mutex> lock(pool.mu);
  auto it = pool.free.lower_bound(size);
  if (it == pool.free.end() || it->first / 2 > size) return nullptr;
  char* header = it->second;
  pool.bytes -= it->first;
  pool.free.erase(it);
  return header;
}

bool ToPool(char* header) {
  const size_t capacity = CapacityOf(header);
  if (capacity < kPooledMin) return false;
  Pool& pool = ThePool();
  std::lock_guard<std::mutex> lock(pool.mu);
  if (pool.bytes + capacity > kPoolBytes) return false;
  pool.free.emplace(capacity, header);
  pool.bytes += capacity;
  return true;
}

}  // namespace

void* AllocateOutput(int64_t bytes) {
  const size_t size = (static_cast<size_t>(bytes > 0 ? bytes : 1) + 63) / 64 * 64;
  char* header = size >= kPooledMin ? FromPool(size) : nullptr;
  if (header == nullptr) {
    header = static_cast<char*>(std::aligned_alloc(64, size + kHeader));
    if (header == nullptr) return nullptr;
    CapacityOf(header) = size;
  }
  return header + kHeader;
}

void FreeOutput(void* p) {
  if (p == nullptr) return;
  char* header = static_cast<char*>(p) - kHeader;
  if (!ToPool(header)) std::free(header);
}

}  // namespace hvdlite
