// Reading a benchmark's printed tables in tests: sections start with a "== title" line and
// end at a blank line or the next section.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace weft::test {

// The lines of the section whose "== title" line starts with `title`, up to the next blank
// line or section; empty when there is none.
inline std::vector<std::string> bench_section(const std::string& text, const std::string& title) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  bool in = false;
  for (std::string l; std::getline(ss, l);) {
    if (l.rfind("== " + title, 0) == 0)
      in = true;
    else if (in && (l.empty() || l.rfind("== ", 0) == 0))
      break;
    else if (in)
      out.push_back(l);
  }
  return out;
}

}  // namespace weft::test
