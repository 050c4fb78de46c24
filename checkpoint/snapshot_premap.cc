#include "checkpoint/snapshot_premap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weft::checkpoint {

uint64_t segment_inode(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return 0;
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0;
  ::close(fd);
  return ok ? uint64_t(st.st_ino) : 0;
}

void PremappedSegments::map_in(const std::vector<std::string>& names) {
  std::map<std::string, Premapped> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& n : names)
      if (auto it = segments_.find(n); it != segments_.end()) now.emplace(n, it->second);
  }
  for (const std::string& n : names) {
    try {
      Premapped& m = now[n];
      const uint64_t inode = segment_inode(n);
      if (!m.segment || m.inode != inode) {
        m.segment = std::make_shared<const SnapshotSegment>(SnapshotSegment::open(n, false));
        m.inode = inode;
        m.slots_in.clear();
      }
      for (int slot = 0; slot < m.segment->slots(); ++slot) {
        if (m.slots_in.count(slot)) continue;
        if (const std::optional<SnapshotSegment::View> v = m.segment->slot(slot)) {
          m.segment->populate(*v);
          m.slots_in.insert(slot);
        }
      }
    } catch (const std::exception&) {
      now.erase(n);  // gone or being rewritten: the recovery reads it as before
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  segments_ = std::move(now);  // segments no longer named are unmapped
}

std::shared_ptr<const SnapshotSegment> PremappedSegments::mapping(const std::string& name) const {
  Premapped m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(name);
    if (it == segments_.end()) return nullptr;
    m = it->second;
  }
  if (m.inode != segment_inode(name)) return nullptr;
  for (int slot = 0; slot < m.segment->slots(); ++slot)
    if (m.segment->slot(slot) && !m.slots_in.count(slot)) return nullptr;
  return m.segment;
}

}  // namespace weft::checkpoint
