// The real chat templates in shared/templates (70 models' tokenizer chat templates, with thinking
// and tool-call markup) rendered by arbor and by Python's jinja2 in the environment Hugging Face
// transformers' apply_chat_template uses (tests/chat/render_chat_reference.py), over the
// conversations of tests/chat/data/template_cases.json. Every (template, case) must agree byte for
// byte; where jinja2 raises, arbor must fail too (with raise_exception's exact message).
//
// The expected texts come from jinja2 at test time (python3-jinja2, installed by
// scripts/install_deps.sh --tests), written to the build folder; nothing here is a golden that
// arbor produced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::chat {
namespace {

using ojson = nlohmann::ordered_json;

// The instant strftime_now() formats on both sides: 2024-07-26 08:00:00 UTC.
constexpr int64_t kNow = 1721980800;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::vector<std::string> template_files() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(test::shared_path("templates"))) {
    if (e.path().extension() == ".jinja") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

ojson read_json(const std::string& path) {
  return ojson::parse(test::read_file(path), nullptr, /*allow_exceptions=*/false);
}

// Runs the reference over every template and case; returns its results array (or null).
ojson reference_results(const std::vector<std::string>& files, const std::string& cases_path) {
  const std::string out = "chat_template_reference.json";  // in the test's build folder
  std::string cmd = str_cat("/usr/bin/python3 ", quoted(ARBOR_SOURCE_DIR), "/tests/chat/",
                            "render_chat_reference.py --cases ", quoted(cases_path), " --out ", out,
                            " --now ", kNow);
  for (const std::string& f : files) cmd += " " + quoted(f);
  const test::CommandResult r = test::run_shell(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.output()
                            << "(the reference needs /usr/bin/python3 with jinja2: "
                               "scripts/install_deps.sh --tests installs python3-jinja2)";
  const ojson doc = read_json(out);
  if (!doc.is_object() || !doc.contains("results")) return nullptr;
  std::printf("reference: jinja2 %s, %zu results in %s/%s\n",
              doc["jinja2_version"].get<std::string>().c_str(), doc["results"].size(),
              std::filesystem::current_path().c_str(), out.c_str());
  return doc["results"];
}

// Control characters escaped so an excerpt fits on one line of the report.
std::string visible(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out;
}

// Where `got` first differs from `want`, with some text either side.
std::string diff_excerpt(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  return str_cat("first difference at byte ", i, " (lengths ", want.size(), " and ", got.size(),
                 ")\n      jinja2: ", visible(want.substr(from, i - from + 80)),
                 "\n      arbor:  ", visible(got.substr(from, i - from + 80)));
}

ChatRenderOptions options_for(const ojson& spec, const ojson& c) {
  ChatRenderOptions o;
  o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  o.bos_token = spec["bos_token"].get<std::string>();
  o.eos_token = spec["eos_token"].get<std::string>();
  o.now_unix_seconds = kNow;
  if (c.contains("tools")) o.extra["tools"] = c["tools"];
  if (c.contains("documents")) o.extra["documents"] = c["documents"];
  if (c.contains("kwargs")) {
    for (auto it = c["kwargs"].begin(); it != c["kwargs"].end(); ++it) o.extra[it.key()] = *it;
  }
  return o;
}

// "" when arbor agrees with the reference result `ref`, else what differs.
std::string compare(const Result<ChatTemplate>& tmpl, const ojson& spec, const ojson& c,
                    const ojson& ref) {
  const std::string status = ref["status"].get<std::string>();
  const std::string want = ref["text"].get<std::string>();
  if (status == "syntax_error") {
    return tmpl.ok() ? "jinja2 rejects the template (" + want + "); arbor parses it" : "";
  }
  if (!tmpl.ok()) return "arbor rejects the template: " + tmpl.status().to_string();
  const Result<std::string> got = tmpl->render_json(c["messages"], options_for(spec, c));
  if (status == "ok") {
    if (!got.ok()) return "arbor fails: " + got.status().to_string();
    return *got == want ? "" : diff_excerpt(want, *got);
  }
  if (got.ok()) return "jinja2 fails (" + status + ": " + want + "); arbor renders";
  const std::string& message = got.status().message();
  if (status == "raised") {
    if (message == want) return "";
    return "raise_exception message differs\n      jinja2: " + want + "\n      arbor:  " + message;
  }
  // Both fail; for the same reason: arbor's message names Python's exception type (a runaway
  // recursion is Python's RecursionError and arbor's macro depth limit).
  const std::string type = want.substr(0, want.find(':'));
  const std::string expected = type == "RecursionError" ? "macro calls nested deeper" : type;
  if (message.find(expected) != std::string::npos) return "";
  return "both fail, for different reasons\n      jinja2: " + want + "\n      arbor:  " + message;
}

TEST(ChatTemplateReference, RealTemplatesRenderAsJinja2Does) {
  ASSERT_TRUE(test::require_shared_file("templates"));
  const std::vector<std::string> files = template_files();
  ASSERT_GE(files.size(), 70u) << "shared/templates should hold the 70 real templates";
  const std::string cases_path = str_cat(ARBOR_SOURCE_DIR, "/tests/chat/data/template_cases.json");
  const ojson spec = read_json(cases_path);
  ASSERT_TRUE(spec.is_object() && spec["cases"].is_array()) << cases_path;
  const ojson& cases = spec["cases"];
  const ojson results = reference_results(files, cases_path);
  ASSERT_TRUE(results.is_array());
  ASSERT_EQ(results.size(), files.size() * cases.size());

  size_t matched = 0, failing_cases = 0, k = 0;
  std::map<std::string, int> mismatches_per_template;
  std::string report;
  for (const std::string& file : files) {
    const std::string name = std::filesystem::path(file).filename().string();
    const Result<ChatTemplate> tmpl = ChatTemplate::parse(test::read_file(file));
    for (const ojson& c : cases) {
      const ojson& ref = results[k++];
      ASSERT_EQ(ref["template"].get<std::string>(), name);
      ASSERT_EQ(ref["case"], c["name"]);
      if (ref["status"] != "ok") ++failing_cases;
      const std::string problem = compare(tmpl, spec, c, ref);
      if (problem.empty()) {
        ++matched;
        continue;
      }
      ++mismatches_per_template[name];
      report += str_cat("  ", name, " / ", c["name"].get<std::string>(), ": ", problem, "\n");
    }
  }
  std::printf(
      "%zu of %zu (template, case) pairs agree with jinja2 (%zu templates x %zu cases; "
      "jinja2 fails %zu of them)\n",
      matched, results.size(), files.size(), cases.size(), failing_cases);
  for (const auto& [name, n] : mismatches_per_template)
    std::printf("  %s: %d of %zu cases differ\n", name.c_str(), n, cases.size());
  EXPECT_EQ(matched, results.size()) << "mismatches:\n" << report;
}

}  // namespace
}  // namespace arbor::chat
