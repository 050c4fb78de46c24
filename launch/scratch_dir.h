// weft run's scratch folders (the workers' error files when there is no log folder; an
// elastic node agent's epoch notices): each made under the temporary directory with its
// owner's pid in the name, removed when the job ends, and, when its owner was killed
// (SIGKILL leaves no chance to remove it), removed by the next weft run on the machine that
// finds its owner gone, or by the bench that killed it, once reaped (bench_elastic_agent.h).
#pragma once

#include <string>

namespace weft::launch {

class ScratchDir {
 public:
  // Makes $TMPDIR/weft_run_<pid>_XXXXXX, first removing every weft_run_<pid>_* whose pid is
  // no longer a process. IoError when it cannot be made.
  ScratchDir();
  ~ScratchDir();  // removes it
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

  // The sweep alone: removes the scratch folders of dead owners under `dir`; how many.
  static int remove_abandoned(const std::string& dir);

 private:
  std::string path_;
};

}  // namespace weft::launch
