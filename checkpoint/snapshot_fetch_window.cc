#include "checkpoint/snapshot_fetch_window.h"

#include "base/check.h"

namespace weft::checkpoint {

FetchWindow::FetchWindow(const std::vector<std::vector<int>>& needs, int sources, int sets)
    : pieces_(int64_t(needs.size())),
      sets_(sets),
      needs_(needs),
      missing_(needs.size()),
      decoded_(needs.size(), 0),
      handed_(needs.size(), 0),
      cursor_(size_t(sources), 0) {
  WEFT_CHECK(sets >= 1 && sources >= 0, "FetchWindow: ", sets, " sets, ", sources, " sources");
  for (size_t p = 0; p < needs.size(); ++p) {
    for (int s : needs[p]) WEFT_CHECK(s >= 0 && s < sources, "FetchWindow: source ", s);
    missing_[p] = int(needs[p].size());
  }
}

bool FetchWindow::set_free(int64_t piece) const {
  return piece < sets_ || decoded_[size_t(piece - sets_)];
}

int64_t FetchWindow::next_of(int source) const {
  int64_t p = cursor_[size_t(source)];
  while (p < pieces_) {
    bool needs = false;
    for (int s : needs_[size_t(p)]) needs = needs || s == source;
    if (needs) break;
    ++p;
  }
  return p;
}

int64_t FetchWindow::next_fetch(int source) {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (stopped_ || failed_) return -1;
    const int64_t p = next_of(source);
    if (p >= pieces_) return -1;
    if (set_free(p)) {
      cursor_[size_t(source)] = p + 1;
      return p;
    }
    cv_.wait(l);
  }
}

bool FetchWindow::can_fetch(int source) const {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t p = next_of(source);
  return !stopped_ && !failed_ && p < pieces_ && set_free(p);
}

void FetchWindow::arrived(int64_t piece, int source) {
  std::lock_guard<std::mutex> l(mu_);
  WEFT_CHECK(piece >= 0 && piece < pieces_ && missing_[size_t(piece)] > 0, "FetchWindow: piece ",
             piece, " of source ", source, " arrived twice or unasked");
  --missing_[size_t(piece)];
  cv_.notify_all();
}

void FetchWindow::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> l(mu_);
  if (!failed_) failed_ = e;
  cv_.notify_all();
}

void FetchWindow::stop() {
  std::lock_guard<std::mutex> l(mu_);
  stopped_ = true;
  cv_.notify_all();
}

int64_t FetchWindow::next_decode() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (failed_) std::rethrow_exception(failed_);
    if (done_ == pieces_) return -1;
    // Only the pieces whose sets are free can have arrived: the window's first `sets`
    // undecoded ones at most.
    for (int64_t p = 0; p < pieces_; ++p)
      if (!handed_[size_t(p)] && missing_[size_t(p)] == 0 && set_free(p)) {
        handed_[size_t(p)] = 1;
        return p;
      }
    cv_.wait(l);
  }
}

void FetchWindow::decoded(int64_t piece) {
  std::lock_guard<std::mutex> l(mu_);
  WEFT_CHECK(piece >= 0 && piece < pieces_ && handed_[size_t(piece)] && !decoded_[size_t(piece)],
             "FetchWindow: piece ", piece, " decoded twice or not handed out");
  decoded_[size_t(piece)] = 1;
  ++done_;
  cv_.notify_all();
}

}  // namespace weft::checkpoint
