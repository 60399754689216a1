#include "common/socket_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace hvdlite {
namespace net {
namespace {

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

Status Resolve(const std::string& host, int port, bool passive, AddrInfoList* out) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string port_str = std::to_string(port);
  const char* node = host.empty() ? nullptr : host.c_str();
  int rc = getaddrinfo(node, port_str.c_str(), &hints, &out->head);
  if (rc != 0) {
    return Status::InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  return Status::OK();
}

// One nonblocking connect attempt to one address, bounded by `deadline`.
// Returns the connected fd, or -1 with *err set.
int TryConnect(const addrinfo* ai, const Deadline& deadline, int* err) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  SetSocketBuffers(fd);
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno != EINPROGRESS) {
    *err = errno;
    CloseFd(&fd);
    return -1;
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    int n;
    do {
      n = ::poll(&p, 1, deadline.RemainingMs());
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      *err = (n == 0) ? ETIMEDOUT : errno;
      CloseFd(&fd);
      return -1;
    }
    int so_error = 0;
    socklen_t so_len = sizeof(so_error);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &so_len) != 0) so_error = errno;
    if (so_error != 0) {
      *err = so_error;
      CloseFd(&fd);
      return -1;
    }
  }
  SetNoDelay(fd);
  return fd;
}

}  // namespace

std::string ErrnoString(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* s = strerror_r(err, buf, sizeof(buf));
  return std::string(s);
}

bool ParseHostPort(const std::string& addr, std::string* host, int* port) {
  std::string h, p;
  if (!addr.empty() && addr[0] == '[') {
    size_t close = addr.find(']');
    if (close == std::string::npos || close + 1 >= addr.size() || addr[close + 1] != ':') return false;
    h = addr.substr(1, close - 1);
    p = addr.substr(close + 2);
  } else {
    size_t colon = addr.rfind(':');
    if (colon == std::string::npos) return false;
    h = addr.substr(0, colon);
    p = addr.substr(colon + 1);
    if (h.find(':') != std::string::npos) return false;  // unbracketed IPv6
  }
  if (h.empty() || p.empty() || p.size() > 5) return false;
  int value = 0;
  for (char c : p) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  if (value > 65535) return false;
  *host = h;
  *port = value;
  return true;
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status::Internal("fcntl(O_NONBLOCK) failed: " + ErrnoString(errno));
  }
  return Status::OK();
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetSocketBuffers(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

Status ListenTcp(const std::string& host, int port, int* fd_out, int* bound_port) {
  AddrInfoList addrs;
  HVD_RETURN_IF_ERROR(Resolve(host, port, true, &addrs));
  int last_err = 0;
  for (addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    SetSocketBuffers(fd);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last_err = errno;
      CloseFd(&fd);
      continue;
    }
    *fd_out = fd;
    if (bound_port != nullptr) *bound_port = LocalPort(fd);
    return Status::OK();
  }
  return Status::Internal("cannot listen on " + JoinHostPort(host, port) + ": " + ErrnoString(last_err));
}

int AcceptTcp(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      SetNoDelay(fd);
      return fd;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return -1;  // EAGAIN, or EMFILE and friends: the caller polls again later
  }
}

Status ConnectTcp(const std::string& host, int port, const Deadline& deadline, int* fd_out) {
  int backoff_ms = 10;
  std::string last_error = "no attempt made";
  for (;;) {
    AddrInfoList addrs;
    Status st = Resolve(host, port, false, &addrs);
    if (st.ok()) {
      for (addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
        int err = 0;
        int fd = TryConnect(ai, deadline, &err);
        if (fd >= 0) {
          *fd_out = fd;
          return Status::OK();
        }
        last_error = ErrnoString(err);
      }
    } else {
      last_error = st.message();
    }
    int left = deadline.RemainingMs();
    if (left <= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff_ms, left)));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
  return Status::Timeout("could not connect to " + JoinHostPort(host, port) +
                         " before the deadline: " + last_error);
}

bool WaitReadable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  return n > 0;
}

static Status WaitFor(int fd, short events, const Deadline& deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, deadline.RemainingMs());
    if (n > 0) return Status::OK();
    if (n == 0) return Status::Timeout(std::string("timed out while ") + what);
    if (errno != EINTR) return Status::Internal(std::string("poll failed: ") + ErrnoString(errno));
  }
}

Status ReadExact(int fd, void* buf, size_t len, const Deadline& deadline) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= size_t(n);
      continue;
    }
    if (n == 0) return Status::Aborted("connection closed by the other side");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      HVD_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, "reading"));
      continue;
    }
    if (errno == ECONNRESET) return Status::Aborted("connection reset by the other side");
    return Status::Internal("recv failed: " + ErrnoString(errno));
  }
  return Status::OK();
}

Status WriteExact(int fd, const void* buf, size_t len, const Deadline& deadline) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n >= 0) {
      p += n;
      len -= size_t(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      HVD_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, "writing"));
      continue;
    }
    if (errno == EPIPE || errno == ECONNRESET) return Status::Aborted("connection closed by the other side");
    return Status::Internal("send failed: " + ErrnoString(errno));
  }
  return Status::OK();
}

std::string LocalHost(int fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

int LocalPort(int fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

void CloseFd(int* fd) {
  if (*fd >= 0) {
    ::close(*fd);  // never retry on EINTR: Linux has already released the fd
    *fd = -1;
  }
}

}  // namespace net
}  // namespace hvdlite
