#include "runtime/affinity.h"

#include <dirent.h>
#include <sched.h>

#include <cstdlib>
#include <vector>

#include "common/logging.h"

namespace hvdlite {

void PinToCoreIfHostIsFull(const Topology& topo) {
  if (topo.local_size < 2) return;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (static_cast<int>(cpus.size()) != topo.local_size) return;
  const int cpu = cpus[topo.local_rank % cpus.size()];
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  int pinned = 0, failed = 0;
  if (DIR* dir = opendir("/proc/self/task")) {  // every thread: the caller's and any library's
    while (dirent* e = readdir(dir)) {
      const int tid = std::atoi(e->d_name);
      if (tid <= 0) continue;
      (sched_setaffinity(tid, sizeof(one), &one) == 0 ? pinned : failed)++;
    }
    closedir(dir);
  }
  HVD_LOG(kDebug, "pinned " << pinned << " thread(s) to CPU " << cpu << " (local rank " << topo.local_rank
                            << " of " << topo.local_size << " on " << cpus.size() << " CPUs)"
                            << (failed ? "; some threads could not be pinned" : ""));
}

}  // namespace hvdlite
