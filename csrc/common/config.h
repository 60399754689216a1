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

  // Reads HVDLITE_<name>, falling back to HOROVOD_<name>. A value that does not
  // parse is an InvalidArgument naming the variable.
  static Status FromEnv(Config* out);
};

}  // namespace hvdlite
