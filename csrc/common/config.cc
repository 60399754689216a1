#include "common/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace hvdlite {
namespace {

const char* Lookup(const char* name) {
  std::string key = std::string("HVDLITE_") + name;
  const char* v = std::getenv(key.c_str());
  if (v != nullptr && *v != '\0') return v;
  key = std::string("HOROVOD_") + name;
  v = std::getenv(key.c_str());
  if (v != nullptr && *v != '\0') return v;
  return nullptr;
}

Status Bad(const char* name, const char* text, const char* what) {
  return Status::InvalidArgument(std::string("HVDLITE_") + name + "='" + text + "' is not " + what);
}

Status Parse(const char* name, const char* text, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return Bad(name, text, "an integer");
  *out = v;
  return Status::OK();
}

Status Parse(const char* name, const char* text, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0') return Bad(name, text, "a number");
  *out = v;
  return Status::OK();
}

Status Parse(const char*, const char* text, bool* out) {
  std::string s(text);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  *out = (s == "1" || s == "true" || s == "yes" || s == "on");
  return Status::OK();
}

Status Parse(const char*, const char* text, std::string* out) {
  *out = text;
  return Status::OK();
}

// The first of `names` that is set and parses as an integer, else -1.
int64_t LauncherInt(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    int64_t out = -1;
    if (v != nullptr && *v != '\0' && Parse(n, v, &out).ok()) return out;
  }
  return -1;
}

}  // namespace

Status Config::FromEnv(Config* out) {
  Config c;
#define HVD_SETTING(name, type, def, doc)             \
  if (const char* text = Lookup(#name)) {             \
    HVD_RETURN_IF_ERROR(Parse(#name, text, &c.name)); \
  }
#include "hvdlite_settings.inc"
#undef HVD_SETTING
  c.mpi_launch.rank = LauncherInt({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"});
  c.mpi_launch.size = LauncherInt({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  c.mpi_launch.local_rank = LauncherInt({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"});
  c.mpi_launch.local_size = LauncherInt({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"});
  *out = c;
  return Status::OK();
}

}  // namespace hvdlite
