// The run folder's history: a resumed run continues its own metrics.jsonl (lines before the
// resume step kept, later ones replaced), and a new run never writes over another run's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/io/metrics.h"

namespace weft::comm {
class Communicator;
}

namespace weft::launch {

struct RunFolder {
  std::string out;           // the folder this run writes (config.yaml, loss_curve.svg, ...)
  std::string metrics_path;  // its metrics.jsonl, or --metrics
  std::string note;          // one line for the user when the folder or the file changed; or ""
};

// Chooses the folder and the metrics file of a run. `out_dir` is train.out_dir,
// `metrics_flag` the --metrics path ("" when not given), `resume_step` the step a resumed
// run continues from (nullopt for a new run).
// - Resumed: the same folder; the metrics file keeps the lines of steps before
//   `resume_step` (what the checkpoint's run had done) and drops the rest, which the
//   resumed run writes again.
// - New, and the default metrics file already holds lines of another run: the run goes to
//   the first free sibling `<out_dir>-2`, `<out_dir>-3`, ... (never over the earlier run).
// - New with an explicit --metrics file that holds lines: the user named it; it is
//   replaced, and the note says so.
// Creates nothing; throws IoError when an existing metrics file cannot be read.
RunFolder choose_run_folder(const std::string& out_dir, const std::string& metrics_flag,
                            std::optional<int64_t> resume_step);

// Opens the metrics writer for `folder`: truncated for a new run; for a resumed run the
// kept lines are written back first (atomically: a temporary file renamed over the old).
std::unique_ptr<core::io::MetricsWriter> open_metrics(const RunFolder& folder,
                                                      std::optional<int64_t> resume_step);

// A world resumed at `resume_step` right after a step whose line its file lacks: every rank
// agreed that step's statistics, but the lead that writes lines did not finish it (torn by a
// collective after the agreement) or was lost, while a peer finished it. Appends `line`, a
// line some rank kept of that step, when it is the step before `resume_step` and the file
// has none of it; returns whether it wrote.
bool append_agreed_line(core::io::MetricsWriter& w, const core::io::StepMetrics& line,
                        int64_t resume_step);

// Collective over a new world (every rank, departing ones too): hands the lead (rank 0) the
// line of step `step` (the one before the step the world resumes at) when the lead lacks it
// and another rank has it. `mine` is the line this rank kept of the last step it finished or
// whose statistics it agreed. A lead that lost its part of the agreement itself (its
// statistics all-gather failed when a peer died, while another rank's completed and that
// rank finished the step) kept nothing of the step; the step's line then comes from the
// lowest rank that kept it. Returns, on rank 0, that line or its own; elsewhere `mine`. One
// all-reduce, plus a broadcast only when the lead lacks the line and a peer has it.
std::optional<core::io::StepMetrics> share_agreed_line(
    comm::Communicator& world, const std::optional<core::io::StepMetrics>& mine, int64_t step);

// A step's line as text and back, exactly (hexadecimal floating point): what
// share_agreed_line sends. parse_step_line throws InternalError on text it did not write.
std::string format_step_line(const core::io::StepMetrics& m);
core::io::StepMetrics parse_step_line(const std::string& text);

}  // namespace weft::launch
