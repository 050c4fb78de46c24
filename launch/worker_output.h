// Where a worker's stdout and stderr go under `weft run`: the console, each line prefixed
// [rank r] (unless --local-ranks-filter leaves the rank out or --redirects takes the stream
// off), and DIR/attempt_0/rank_R/{stdout,stderr}.log under --log-dir (the streams named by
// --redirects or --tee; both when neither is given). torchrun's numbers: 0 none, 1 stdout,
// 2 stderr, 3 both; one number for every rank or per rank "0:1,1:2".
#pragma once

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "launch/run_options.h"

namespace weft::launch {

// As parse_run_options() read them (it validates their text).
struct OutputOptions {
  std::string log_dir;                  // "" = no files
  StdStreams redirects, tee;            // bit 1 stdout, bit 2 stderr, per local rank
  std::vector<int> local_ranks_filter;  // empty = every rank on the console
};

// One stream of one rank: the read end of its pipe, what is not yet a whole line, and where
// lines go.
class StreamSink {
 public:
  StreamSink(int rank, FILE* console, std::string file);  // console or file may be null/""
  ~StreamSink();
  StreamSink(const StreamSink&) = delete;
  StreamSink& operator=(const StreamSink&) = delete;
  // Reads what the pipe has (non-blocking); returns false once it reached end of file.
  bool pump();
  // Emits an unfinished last line and closes the pipe.
  void finish();
  int fd() const { return fd_; }
  void set_fd(int fd) { fd_ = fd; }

 private:
  void emit(bool all);
  int rank_;
  int fd_ = -1;
  FILE* console_;
  FILE* file_ = nullptr;
  std::string partial_;
};

}  // namespace weft::launch
