// Routing of the workers' output to the console and to per-rank log files.
#include "launch/worker_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace weft::launch {

namespace {

int parse_bits(const std::string& v, const std::string& flag) {
  if (v.size() == 1 && v[0] >= '0' && v[0] <= '3') return v[0] - '0';
  throw ConfigError(flag, "expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or per rank "
                          "like 0:1,1:2; got '" + v + "'");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

int parse_rank(const std::string& v, const std::string& flag) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 6)
    throw ConfigError(flag, "expected a rank number, got '" + v + "'");
  return std::stoi(v);
}

}  // namespace

int streams_for(const std::string& spec, int rank, const std::string& flag) {
  if (spec.empty()) return 0;
  if (spec.find(':') == std::string::npos) return parse_bits(spec, flag);
  int bits = 0;
  for (const std::string& item : split(spec, ',')) {
    size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw ConfigError(flag, "expected RANK:STREAMS items like 0:1,1:2; got '" + item + "'");
    int bits_here = parse_bits(item.substr(colon + 1), flag);
    if (parse_rank(item.substr(0, colon), flag) == rank) bits = bits_here;
  }
  return bits;
}

void check_output_options(const OutputOptions& o) {
  streams_for(o.redirects, 0, "--redirects");
  streams_for(o.tee, 0, "--tee");
  if (!o.local_ranks_filter.empty())
    for (const std::string& r : split(o.local_ranks_filter, ','))
      parse_rank(r, "--local-ranks-filter");
}

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
