// Config: every HVDLITE_* setting, read once from the environment.
// Fields, types and defaults come from hvdlite/common/settings.py through the
// generated X-macro list hvdlite_settings.inc; this is the only place in the
// core that calls getenv().
#pragma once
#include <cstdint>
#include <string>

#include "common/status.h"

namespace hvdlite {

struct Config {
#define HVD_SETTING(name, type, def, doc) type name = def;
#include "hvdlite_settings.inc"
#undef HVD_SETTING

  // Identity an MPI launcher gave this process (not settings: the launcher's
  // own variables, read here so FromEnv stays the only getenv). -1 = not set.
  // Open MPI: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; MPICH/Hydra:
  // PMI_RANK/PMI_SIZE and MPI_LOCALRANKID/MPI_LOCALNRANKS.
  struct MpiLaunch {
    int64_t rank = -1, size = -1, local_rank = -1, local_size = -1;
    bool active() const { return rank >= 0 && size > 0; }
  } mpi_launch;

  // Reads HVDLITE_<name>, falling back to HOROVOD_<name>. A value that does not
  // parse is an InvalidArgument naming the variable.
  static Status FromEnv(Config* out);
};

}  // namespace hvdlite
