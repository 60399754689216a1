#include "common/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

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

}  // namespace

Status Config::FromEnv(Config* out) {
  Config c;
#define HVD_SETTING(name, type, def, doc)                  \
  if (const char* text = Lookup(#name)) {                  \
    HVD_RETURN_IF_ERROR(Parse(#name, text, &c.name));      \
  }
#include "hvdlite_settings.inc"
#undef HVD_SETTING
  *out = c;
  return Status::OK();
}

}  // namespace hvdlite
