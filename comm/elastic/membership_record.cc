// MembershipRecord's text encoding and its strict decoder.
#include "comm/elastic/membership_record.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "base/check.h"
#include "base/error.h"

namespace weft::comm {
namespace {

constexpr const char* kTag = "weft-rdzv 1";

[[noreturn]] void bad(const std::string& key, size_t line_no, const std::string& line,
                      const std::string& why) {
  throw CommError(str("rendezvous record at store key '", key, "' is corrupt: line ", line_no, " '",
                      line.substr(0, 80), "': ", why));
}

int64_t parse_int(const std::string& s, const std::string& key, size_t n, const std::string& l) {
  if (s.empty() || s.size() > 18) bad(key, n, l, "expected an integer");
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) bad(key, n, l, "expected an integer");
  for (size_t j = i; j < s.size(); ++j)
    if (s[j] < '0' || s[j] > '9') bad(key, n, l, "expected an integer");
  return std::stoll(s);
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > 256) return false;
  for (unsigned char c : id)
    if (c <= ' ' || c == 0x7f || c == '/') return false;
  return true;
}

// "<rank> <node id>" of a member or departed line.
std::pair<int, std::string> ranked_node(const std::string& rest, const std::string& field,
                                        const std::string& key, size_t n, const std::string& l) {
  const size_t sp = rest.find(' ');
  if (sp == std::string::npos) bad(key, n, l, "expected '" + field + " <rank> <node id>'");
  const int64_t rank = parse_int(rest.substr(0, sp), key, n, l);
  std::string id = rest.substr(sp + 1);
  if (rank < 0 || rank > 1'000'000) bad(key, n, l, "rank out of range");
  if (!valid_id(id)) bad(key, n, l, "bad node id");
  return {int(rank), std::move(id)};
}

}  // namespace

std::optional<int> MembershipRecord::rank_of(const std::string& node_id) const {
  auto it = members.find(node_id);
  if (it == members.end() || has_left(node_id)) return std::nullopt;
  return it->second;
}

bool MembershipRecord::is_spare(const std::string& node_id) const {
  return std::find(spares.begin(), spares.end(), node_id) != spares.end();
}

bool MembershipRecord::has_left(const std::string& node_id) const {
  return std::find(left.begin(), left.end(), node_id) != left.end();
}

void MembershipRecord::note_process_loss(const std::string& node_id) {
  std::erase_if(process_losses, [&](const std::pair<int64_t, std::string>& x) {
    return x.first <= epoch - kProcessLossEpochs || x == std::make_pair(epoch, node_id);
  });
  process_losses.emplace_back(epoch, node_id);
}

std::string encode(const MembershipRecord& r) {
  std::ostringstream os;
  os << kTag << "\nversion " << r.version << "\nwriter " << r.writer << "\nepoch " << r.epoch
     << "\n";
  std::vector<std::pair<int, std::string>> by_rank;
  for (const auto& [id, rank] : r.members) by_rank.emplace_back(rank, id);
  std::sort(by_rank.begin(), by_rank.end());
  for (const auto& [rank, id] : by_rank) os << "member " << rank << " " << id << "\n";
  for (const auto& id : r.spares) os << "spare " << id << "\n";
  for (const auto& id : r.left) os << "left " << id << "\n";
  for (const auto& id : r.hands_over) os << "hands_over " << id << "\n";
  for (const auto& [id, rank] : r.departed) os << "departed " << rank << " " << id << "\n";
  for (const auto& [local, id] : r.replaced) os << "replaced " << local << " " << id << "\n";
  for (const auto& [epoch, id] : r.process_losses)
    os << "process_lost " << epoch << " " << id << "\n";
  if (r.round > 0) os << "round " << r.round << "\n";
  if (r.closed) {
    std::string reason = r.close_reason;
    std::replace_if(
        reason.begin(), reason.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
    os << "closed " << reason << "\n";
  }
  return os.str();
}

MembershipRecord decode(const std::string& text, const std::string& key) {
  MembershipRecord r;
  std::istringstream in(text);
  std::string line;
  size_t n = 0;
  std::set<int> ranks;
  std::set<std::string> seen_spares, seen_left, seen_handing;
  bool have_version = false, have_writer = false, have_epoch = false;
  while (std::getline(in, line)) {
    ++n;
    if (n == 1) {
      if (line != kTag) bad(key, n, line, str("expected '", kTag, "'"));
      continue;
    }
    size_t sp = line.find(' ');
    std::string field = line.substr(0, sp);
    std::string rest = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (field == "version") {
      r.version = parse_int(rest, key, n, line);
      have_version = true;
    } else if (field == "writer") {
      r.writer = rest;  // may be empty only in a hand-made record; not an id check
      have_writer = true;
    } else if (field == "epoch") {
      r.epoch = parse_int(rest, key, n, line);
      if (r.epoch < 0) bad(key, n, line, "negative epoch");
      have_epoch = true;
    } else if (field == "member" || field == "departed") {
      const auto [rank, id] = ranked_node(rest, field, key, n, line);
      if (field == "member" && !ranks.insert(rank).second) bad(key, n, line, "rank given twice");
      auto& into = field == "member" ? r.members : r.departed;
      if (!into.emplace(id, rank).second) bad(key, n, line, "node given twice");
    } else if (field == "replaced") {
      r.replaced.push_back(ranked_node(rest, field, key, n, line));
    } else if (field == "process_lost") {
      const size_t sp = rest.find(' ');
      if (sp == std::string::npos) bad(key, n, line, "expected 'process_lost <epoch> <node id>'");
      const int64_t epoch = parse_int(rest.substr(0, sp), key, n, line);
      std::string id = rest.substr(sp + 1);
      if (epoch < 1) bad(key, n, line, "epoch out of range");
      if (!valid_id(id)) bad(key, n, line, "bad node id");
      r.process_losses.emplace_back(epoch, std::move(id));
    } else if (field == "spare" || field == "left" || field == "hands_over") {
      if (!valid_id(rest)) bad(key, n, line, "bad node id");
      auto& seen = field == "spare" ? seen_spares : field == "left" ? seen_left : seen_handing;
      if (!seen.insert(rest).second) bad(key, n, line, "node given twice");
      (field == "spare" ? r.spares : field == "left" ? r.left : r.hands_over).push_back(rest);
    } else if (field == "round") {
      r.round = parse_int(rest, key, n, line);
      if (r.round < 1) bad(key, n, line, "a round line holds a round of 1 or more");
    } else if (field == "closed") {
      r.closed = true;
      r.close_reason = rest;
    } else {
      bad(key, n, line, "unknown field");
    }
  }
  if (n == 0) bad(key, 0, "", "empty");
  if (!have_version || !have_writer || !have_epoch)
    bad(key, n, "", "missing version, writer or epoch");
  for (const auto& id : r.left)
    if (!r.members.count(id)) bad(key, n, "left " + id, "a node that left must be a member");
  for (const auto& id : r.hands_over)
    if (!seen_left.count(id)) bad(key, n, "hands_over " + id, "a node that hands over must have left");
  for (const auto& [local, id] : r.replaced)
    if (!r.members.count(id))
      bad(key, n, "replaced " + id, "a replaced worker's node must be a member");
  for (const auto& [epoch, id] : r.process_losses)
    if (epoch > r.epoch)
      bad(key, n, str("process_lost ", epoch, " ", id), "a later epoch than the record's");
  if (r.epoch == 0 && !r.members.empty()) bad(key, n, "", "members before epoch 1");
  return r;
}

void check_node_id(const std::string& id, const std::string& field) {
  if (!valid_id(id))
    throw ConfigError(field, str("node id '", id.substr(0, 80),
                                 "' must be 1 to 256 printable characters without spaces or '/'"));
}

}  // namespace weft::comm
