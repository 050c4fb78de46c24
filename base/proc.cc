#include "base/proc.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace weft {
namespace {

std::string read_proc(pid_t pid, const char* file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The state letter and parent of `pid` from its stat line; false when it went. The command
// name (in parentheses) may hold spaces and parentheses: the fields follow the last ')'.
bool stat_of(pid_t pid, char* state, long* ppid) {
  const std::string stat = read_proc(pid, "stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(stat.substr(close + 1));
  return bool(rest >> *state >> *ppid);
}

}  // namespace

std::vector<pid_t> child_pids(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string n = e.path().filename().string();
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = pid_t(std::stol(n));
    char state = 0;
    long ppid = 0;
    if (stat_of(pid, &state, &ppid) && ppid == parent) out.push_back(pid);
  }
  return out;
}

bool process_running(pid_t pid) {
  char state = 0;
  long ppid = 0;
  return stat_of(pid, &state, &ppid) && state != 'Z';
}

int weft_rank_of(pid_t pid) {
  const std::string env = '\0' + read_proc(pid, "environ");  // each entry follows a '\0'
  const std::string key("\0WEFT_RANK=", 11);
  const size_t at = env.find(key);
  return at == std::string::npos ? -1 : std::atoi(env.c_str() + at + key.size());
}

pid_t worker_child(pid_t parent, int rank) {
  for (pid_t c : child_pids(parent)) {
    const int r = weft_rank_of(c);
    if (r >= 0 && (rank < 0 || r == rank) && process_running(c)) return c;
  }
  return -1;
}

}  // namespace weft
