// Small TCP helpers shared by the rendezvous store and the transports (in common/, the layer
// below both, so neither depends on the other for them).
//
// All sockets made here are nonblocking and close-on-exec; every wait is a
// poll() bounded by a Deadline. Sends use MSG_NOSIGNAL, so a closed peer is an
// EPIPE error, never a SIGPIPE.
#pragma once
#include <cstddef>
#include <string>

#include "common/deadline.h"
#include "common/status.h"

namespace hvdlite {
namespace net {

constexpr int kSocketBufferBytes = 4 << 20;

// "host:port" or "[v6addr]:port" -> host, port. False when malformed.
bool ParseHostPort(const std::string& addr, std::string* host, int* port);
// The inverse: brackets a host that contains ':'.
std::string JoinHostPort(const std::string& host, int port);

Status SetNonBlocking(int fd);
void SetNoDelay(int fd);
// Asks for large send and receive buffers (set before listen()/connect() so
// the TCP window scale covers them). Failure is ignored: it is only a hint.
void SetSocketBuffers(int fd, int bytes = kSocketBufferBytes);

// A nonblocking listening socket on host:port (port 0 = ephemeral), with the
// large buffers set so accepted sockets inherit them.
Status ListenTcp(const std::string& host, int port, int* fd, int* bound_port);
// Accepts one pending connection of a nonblocking listener: a nonblocking,
// TCP_NODELAY socket, or -1 when none is pending (or on a transient error).
int AcceptTcp(int listen_fd);
// Connects to host:port, retrying (refused, unreachable, name lookup failure)
// with a short backoff until `deadline`. The socket is nonblocking, TCP_NODELAY.
Status ConnectTcp(const std::string& host, int port, const Deadline& deadline, int* fd);

// Reads / writes exactly `len` bytes on a nonblocking socket, polling until
// `deadline`. EOF / reset -> Aborted, deadline -> Timeout, else Internal.
Status ReadExact(int fd, void* buf, size_t len, const Deadline& deadline);
Status WriteExact(int fd, const void* buf, size_t len, const Deadline& deadline);

// Waits until fd is readable (or has an error/EOF pending). False on timeout.
bool WaitReadable(int fd, int timeout_ms);

// Local address of a bound/connected socket ("" / -1 on error).
std::string LocalHost(int fd);
int LocalPort(int fd);

// close() that ignores EINTR and sets *fd to -1. No-op for -1.
void CloseFd(int* fd);

// strerror(err) as a std::string.
std::string ErrnoString(int err);

}  // namespace net
}  // namespace hvdlite
