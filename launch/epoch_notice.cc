// The epoch notice file: a few "key value" lines, replaced atomically.
#include "launch/epoch_notice.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/error.h"

namespace weft::launch {

void write_epoch_notice(const std::string& path, const EpochNotice& n) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "epoch " << n.epoch << "\nnode_index " << n.node_index << "\nnnodes " << n.nnodes
      << "\nnproc " << n.nproc << "\nstore_host " << n.store_host << "\nstore_port " << n.store_port
      << "\nstore_prefix " << n.store_prefix << "\nlost " << (n.lost ? 1 : 0) << "\nlost_at "
      << n.lost_at << "\ntransit_nodes " << n.transit_nodes << "\nleave " << (n.leave ? 1 : 0)
      << "\nreleased " << (n.released ? 1 : 0) << "\nrestart_count " << n.restart_count
      << "\nlost_since";
    for (const auto& [epoch, lost] : n.lost_since) f << " " << epoch << ":" << (lost ? 1 : 0);
    f << "\nwhy " << n.why << "\n";
    if (!f) throw IoError("cannot write the epoch notice " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw IoError("cannot replace the epoch notice " + path + ": " + ec.message());
}

namespace {
// "3:0 4:1" -> {3: false, 4: true}; std::invalid_argument for anything else.
std::map<int64_t, bool> parse_lost_since(const std::string& value) {
  std::map<int64_t, bool> out;
  std::istringstream in(value);
  for (std::string item; in >> item;) {
    const size_t colon = item.find(':');
    const std::string flag = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (flag != "0" && flag != "1") throw std::invalid_argument(item);
    out[std::stoll(item.substr(0, colon))] = flag == "1";
  }
  return out;
}
}  // namespace

std::optional<EpochNotice> read_epoch_notice(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  EpochNotice n;
  std::string line;
  int seen = 0;
  while (std::getline(f, line)) {
    const size_t sp = line.find(' ');
    const std::string key = line.substr(0, sp), value = sp == std::string::npos ? "" : line.substr(sp + 1);
    try {
      if (key == "epoch") n.epoch = std::stoll(value), ++seen;
      else if (key == "node_index") n.node_index = std::stoi(value), ++seen;
      else if (key == "nnodes") n.nnodes = std::stoi(value), ++seen;
      else if (key == "nproc") n.nproc = std::stoi(value), ++seen;
      else if (key == "store_host") n.store_host = value;
      else if (key == "store_port") n.store_port = std::stoi(value), ++seen;
      else if (key == "store_prefix") n.store_prefix = value;
      else if (key == "lost") n.lost = value == "1";
      else if (key == "lost_at") n.lost_at = std::stoll(value);
      else if (key == "transit_nodes") n.transit_nodes = std::stoi(value);
      else if (key == "leave") n.leave = value == "1";
      else if (key == "released") n.released = value == "1";
      else if (key == "restart_count")
        n.restart_count = std::stoi(value);
      else if (key == "lost_since") n.lost_since = parse_lost_since(value);
      else if (key == "why") n.why = value;
    } catch (const std::exception&) {
      throw IoError("epoch notice " + path + ": bad value for " + key + ": '" + value + "'");
    }
  }
  if (seen < 5) throw IoError("epoch notice " + path + ": incomplete");
  return n;
}

std::optional<EpochNotice> EpochWatch::newer() const {
  if (path_.empty()) return std::nullopt;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return std::nullopt;
  // rename() gives the file a new inode: a changed inode or mtime means a new notice.
  const int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (st.st_ino != ino_ || mtime != mtime_ || !cached_) {
    try {
      cached_ = read_epoch_notice(path_);
    } catch (const IoError&) {
      return std::nullopt;  // being replaced: the next look sees the whole file
    }
    ino_ = st.st_ino;
    mtime_ = mtime;
  }
  if (cached_ && cached_->epoch > epoch_) return cached_;
  return std::nullopt;
}

void mark_following(const std::string& path, int local_rank) {
  std::ofstream(path + ".live." + std::to_string(local_rank)) << ::getpid() << "\n";
}

bool all_following(const std::string& path, int nproc) {
  for (int r = 0; r < nproc; ++r)
    if (::access((path + ".live." + std::to_string(r)).c_str(), F_OK) != 0) return false;
  return true;
}

void mark_handed_over(const std::string& path, int local_rank, int64_t epoch) {
  const std::string file = path + ".handed." + std::to_string(local_rank);
  const std::string tmp = file + ".tmp";
  std::ofstream(tmp, std::ios::trunc) << epoch << "\n";
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);  // whole or absent, for the agent's look
  if (ec) throw IoError("cannot write " + file + ": " + ec.message());
}

bool all_handed_over(const std::string& path, int nproc, int64_t epoch) {
  for (int r = 0; r < nproc; ++r) {
    std::ifstream f(path + ".handed." + std::to_string(r));
    int64_t e = -1;
    if (!(f >> e) || e != epoch) return false;
  }
  return true;
}

void clear_handed_over(const std::string& path, int nproc) {
  std::error_code ec;
  for (int r = 0; r < nproc; ++r)
    std::filesystem::remove(path + ".handed." + std::to_string(r), ec);
}

bool released_in(const std::string& path, int64_t epoch) {
  try {
    std::optional<EpochNotice> n = read_epoch_notice(path);
    return n && n->released && n->epoch == epoch;
  } catch (const IoError&) {
    return false;  // being replaced: the next look sees the whole file
  }
}

NoticeWaiter::NoticeWaiter(const std::string& path) {
  if (path.empty()) return;
  fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd_ < 0) return;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  // The agent writes a temporary file and renames it over the notice: the rename is the event.
  if (::inotify_add_watch(fd_, dir.empty() ? "." : dir.c_str(), IN_MOVED_TO) < 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

NoticeWaiter::~NoticeWaiter() {
  if (fd_ >= 0) ::close(fd_);
}

bool NoticeWaiter::wait(std::chrono::milliseconds max) {
  if (fd_ < 0) {
    std::this_thread::sleep_for(max);
    return false;
  }
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, int(max.count())) != 1) return false;
  alignas(inotify_event) char buf[4096];
  while (::read(fd_, buf, sizeof buf) > 0) {
  }
  return true;
}

}  // namespace weft::launch
