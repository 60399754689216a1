#include "coordinator/timeline.h"

#include "common/logging.h"

namespace hvdlite {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    return Status::InvalidArgument("cannot open timeline file '" + path + "' for writing");
  mark_cycles_ = mark_cycles;
  origin_ = std::chrono::steady_clock::now();
  rows_.clear();
  open_.clear();
  buffer_ = "[\n";
  first_event_ = true;
  WriteLocked("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"hvdlite\"}}");
  active_ = true;
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  active_ = false;
  buffer_ += "\n]\n";
  FlushLocked();
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

void Timeline::Flush() {
  if (!Active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  FlushLocked();
}

int64_t Timeline::NowUs() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - origin_)
      .count();
}

int Timeline::RowLocked(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  int row = static_cast<int>(rows_.size()) + 1;
  rows_[tensor] = row;
  WriteLocked("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " + std::to_string(row) +
              ", \"args\": {\"name\": " + JsonString(tensor) + "}}");
  return row;
}

void Timeline::WriteLocked(const std::string& event) {
  if (!first_event_) buffer_ += ",\n";
  first_event_ = false;
  buffer_ += event;
  if (buffer_.size() > (64 << 10)) FlushLocked();
}

void Timeline::FlushLocked() {
  if (file_ == nullptr || buffer_.empty()) return;
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size() || std::fflush(file_) != 0) {
    HVD_LOG(kError, "timeline: write failed; the timeline is stopped");
    std::fclose(file_);
    file_ = nullptr;
    active_ = false;
  }
  buffer_.clear();
}

void Timeline::Begin(const std::string& tensor, const std::string& phase) {
  if (!Active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  open_[{tensor, phase}] = NowUs();
}

void Timeline::End(const std::string& tensor, const std::string& phase, const std::string& args) {
  if (!Active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  auto it = open_.find({tensor, phase});
  if (it == open_.end()) return;  // began before the timeline started
  const int64_t start = it->second, end = NowUs();
  open_.erase(it);
  int row = RowLocked(tensor);
  WriteLocked("{\"name\": " + JsonString(phase) + ", \"ph\": \"X\", \"pid\": 0, \"tid\": " +
              std::to_string(row) + ", \"ts\": " + std::to_string(start) +
              ", \"dur\": " + std::to_string(end - start) + ", \"args\": {" + args + "}}");
}

void Timeline::Mark(const std::string& tensor, const std::string& what, const std::string& args) {
  if (!Active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  int row = tensor.empty() ? 0 : RowLocked(tensor);
  WriteLocked("{\"name\": " + JsonString(what) + ", \"ph\": \"i\", \"s\": \"" + (tensor.empty() ? "p" : "t") +
              "\", \"pid\": 0, \"tid\": " + std::to_string(row) + ", \"ts\": " + std::to_string(NowUs()) +
              ", \"args\": {" + args + "}}");
}

}  // namespace hvdlite
