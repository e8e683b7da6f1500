#include "grammar/choice_to_gbnf.h"

#include <optional>
#include <set>

#include "grammar/gbnf_text.h"

namespace arbor::grammar {

Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("guided choice list is empty");
  std::string out = "root ::=";
  std::set<std::string> seen;
  for (size_t i = 0; i < choices.size(); ++i) {
    std::optional<std::u32string> cps = decode_utf8(choices[i]);
    if (!cps) return invalid_argument("guided choice ", i, " is not valid UTF-8");
    if (!seen.insert(choices[i]).second) continue;
    out += seen.size() == 1 ? " " : " | ";
    out += gbnf_literal(*cps);
  }
  return out + "\n";
}

}  // namespace arbor::grammar
