// arbor tokenize -m FILE [--no-bos] [--parse-special] [--pieces] TEXT
//
// Prints the token ids of TEXT on one line, separated by spaces; with --pieces, one
// "id<TAB>piece" line per token instead (the piece JSON-escaped so control bytes stay visible).
// The tokenizer's summary (model, pre-tokenizer, size, BOS/EOS) goes to stderr.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "tokenizer/tokenizer.h"

namespace cmd_tokenize {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  std::string text;
  bool no_bos = false;
  bool parse_special = false;
  bool pieces = false;
};

std::string escape_piece(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

arbor::Status run(const Options& opts) {
  ARBOR_ASSIGN_OR_RETURN(auto tok, arbor::tokenizer::Tokenizer::from_file(opts.model));
  std::fprintf(stderr, "tokenizer: %s\n", tok->summary().c_str());
  arbor::tokenizer::EncodeOptions enc;
  if (opts.no_bos) enc.add_bos = false;
  enc.parse_special = opts.parse_special;
  const std::vector<int32_t> ids = tok->encode(opts.text, enc);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (opts.pieces) {
      out += std::to_string(ids[i]) + "\t" + escape_piece(tok->token_to_piece(ids[i])) + "\n";
    } else {
      if (i > 0) out.push_back(' ');
      out += std::to_string(ids[i]);
    }
  }
  if (!opts.pieces) out.push_back('\n');
  std::fwrite(out.data(), 1, out.size(), stdout);
  return arbor::ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "tokenize", "Print the token ids of a text (a summary of the tokenizer goes to stderr)");
  auto opts = std::make_shared<Options>();
  sub->add_option("-m,--model", opts->model, "GGUF model or vocab file, or tokenizer.json")
      ->required();
  sub->add_flag("--no-bos", opts->no_bos, "Do not prepend BOS even if the vocabulary asks for it");
  sub->add_flag("--parse-special", opts->parse_special,
                "Recognise special tokens such as <|eot_id|> written in the text");
  sub->add_flag("--pieces", opts->pieces, "Print one 'id<TAB>piece' line per token");
  sub->add_option("text", opts->text, "Text to tokenize")->required();
  sub->callback([opts] { arbor::cli::exit_on_error(run(*opts)); });
}
ARBOR_REGISTER_COMMAND(setup);

}  // namespace
