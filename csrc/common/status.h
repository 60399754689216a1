// Status: the one error value that crosses every layer and the C boundary.
// A Status is cheap to copy; ok() statuses carry no message.
#pragma once
#include <string>
#include <utility>

namespace hvdlite {

// Numeric values are part of the C ABI (c_api.h mirrors them) and map to the
// Python exception family (hvdlite/common/exceptions.py).
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad input from this rank's caller
  kMismatch = 2,         // ranks disagree (shape, dtype, op, root, ...)
  kAborted = 3,          // a peer died / closed, or the runtime is shutting down
  kTimeout = 4,          // a bounded wait expired
  kNotSupported = 5,     // backend or dtype lacks the operation
  kPrecondition = 6,     // wrong call order (not initialized, name in flight)
  kInternal = 7,         // a bug or an unexpected system error
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
  static Status Precondition(std::string m) { return {StatusCode::kPrecondition, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#define HVD_RETURN_IF_ERROR(expr)   \
  do {                              \
    ::hvdlite::Status _st = (expr); \
    if (!_st.ok()) return _st;      \
  } while (0)

}  // namespace hvdlite
