// Open-file limit (RLIMIT_NOFILE) checks for components that hold one socket
// per rank: the rendezvous store server (one per client) and the TCP
// transport (one per peer). They call EnsureOpenFiles at start-up, so a job
// larger than the limit fails at once with an error that names the limit and
// the fix, instead of failing (or spinning on EMFILE) in the middle of a
// rendezvous.
#pragma once
#include <cstdint>
#include <string>

#include "common/status.h"

namespace hvdlite {

// Descriptors kept free for everything else a process opens (files, pipes,
// the framework's own sockets) on top of what a component asks for.
constexpr uint64_t kSpareOpenFiles = 256;

// Makes sure this process may hold `needed` + kSpareOpenFiles open files. When
// the soft limit is lower it first raises the soft limit to the hard limit
// (what any process may do); if that is still too low it returns
// InvalidArgument naming `who`, both limits and the fix (`ulimit -n`).
// Process-wide (setrlimit); thread-safe as setrlimit is; never blocks.
Status EnsureOpenFiles(uint64_t needed, const std::string& who);

// The error for an accept()/socket() that failed with EMFILE/ENFILE (errno
// `err`), naming the limit and the fix; `who` says what was opening a socket.
std::string OpenFilesExhausted(int err, const std::string& who);

}  // namespace hvdlite
