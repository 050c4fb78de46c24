// Routing of the workers' output to the console and to per-rank log files.
#include "launch/worker_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace weft::launch {

StreamSink::StreamSink(int rank, FILE* console, std::string file)
    : rank_(rank), console_(console) {
  if (!file.empty()) {
    std::filesystem::create_directories(std::filesystem::path(file).parent_path());
    file_ = std::fopen(file.c_str(), "we");
    if (!file_) throw IoError("weft run: cannot write " + file + ": " + std::strerror(errno));
  }
}

StreamSink::~StreamSink() {
  if (fd_ >= 0) ::close(fd_);
  if (file_) std::fclose(file_);
}

bool StreamSink::pump() {
  if (fd_ < 0) return false;
  char buf[8192];
  for (;;) {
    ssize_t k = ::read(fd_, buf, sizeof buf);
    if (k > 0) {
      if (file_) std::fwrite(buf, 1, size_t(k), file_);
      partial_.append(buf, size_t(k));
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) break;
    ::close(fd_);  // end of file or an error
    fd_ = -1;
    break;
  }
  emit(fd_ < 0);
  if (file_) std::fflush(file_);
  return fd_ >= 0;
}

void StreamSink::finish() {
  if (fd_ >= 0) {
    // Whatever is buffered; a pipe a surviving grandchild still holds is closed regardless.
    pump();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  emit(true);
}

void StreamSink::emit(bool all) {
  size_t start = 0, nl;
  while ((nl = partial_.find('\n', start)) != std::string::npos) {
    if (console_)
      std::fprintf(console_, "[rank %d] %.*s\n", rank_, int(nl - start), partial_.data() + start);
    start = nl + 1;
  }
  partial_.erase(0, start);
  if (all && !partial_.empty()) {
    if (console_) std::fprintf(console_, "[rank %d] %s\n", rank_, partial_.c_str());
    partial_.clear();
  }
  if (console_) std::fflush(console_);
}

}  // namespace weft::launch
