#include "common/fd_limit.h"

#include <errno.h>
#include <sys/resource.h>

#include <cstring>

#include "common/logging.h"

namespace hvdlite {
namespace {

std::string LimitString(rlim_t v) { return v == RLIM_INFINITY ? "unlimited" : std::to_string(v); }

std::string Fix(uint64_t want) {
  return "raise the open-file limit before launching, e.g. `ulimit -n " + std::to_string(want) +
         "` (and the hard limit: `ulimit -Hn`, /etc/security/limits.conf nofile, or systemd LimitNOFILE=)";
}

}  // namespace

Status EnsureOpenFiles(uint64_t needed, const std::string& who) {
  const uint64_t want = needed + kSpareOpenFiles;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    return Status::Internal("getrlimit(RLIMIT_NOFILE) failed: " + std::string(std::strerror(errno)));
  }
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want) return Status::OK();
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      HVD_LOG(kDebug, "raised the open-file soft limit from " << LimitString(lim.rlim_cur) << " to "
                                                              << LimitString(lim.rlim_max) << " for " << who);
      lim = raised;
    }
  }
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want) return Status::OK();
  return Status::InvalidArgument(who + " needs about " + std::to_string(want) +
                                 " open files (one socket per rank, plus " + std::to_string(kSpareOpenFiles) +
                                 " spare), but RLIMIT_NOFILE allows " + LimitString(lim.rlim_cur) +
                                 " (hard limit " + LimitString(lim.rlim_max) + "): " + Fix(want));
}

std::string OpenFilesExhausted(int err, const std::string& who) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  return who + " ran out of file descriptors (" + std::strerror(err) + "; RLIMIT_NOFILE soft " +
         LimitString(lim.rlim_cur) + ", hard " + LimitString(lim.rlim_max) + "): " + Fix(lim.rlim_cur * 2);
}

}  // namespace hvdlite
