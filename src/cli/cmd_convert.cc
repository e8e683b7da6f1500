// `arbor convert llama2c|hf ...`: checkpoint -> GGUF.
#include <memory>
#include <string>

#include "base/log.h"
#include "cli/command.h"
#include "convert/hf.h"
#include "convert/llama2c.h"
#include "convert/model_plan.h"

namespace cmd_convert {  // named, not anonymous: the commands share unity sources

using arbor::Status;

struct Llama2cOptions {
  std::string model_path;
  std::string tokenizer_path;
  std::string out_path;
  std::string type = "f32";
};

struct HfOptions {
  std::string dir;
  std::string out_path;
  std::string type = "f32";
};

Status run_llama2c(const Llama2cOptions& opts) {
  ARBOR_ASSIGN_OR_RETURN(auto type, arbor::convert::parse_output_type(opts.type));
  ARBOR_ASSIGN_OR_RETURN(auto model,
                         arbor::convert::load_llama2c(opts.model_path, opts.tokenizer_path));
  const auto& h = model.header;
  ARBOR_LOG(kInfo) << "llama2.c "
                   << (h.version == 0 ? std::string("legacy")
                                      : "ak42 v" + std::to_string(h.version))
                   << " checkpoint, " << (h.shared_classifier ? "shared" : "separate")
                   << " classifier: " << arbor::convert::describe_plan(model.plan, type);
  auto st = arbor::convert::write_plan(model.plan, type, opts.out_path);
  if (st.ok()) ARBOR_LOG(kInfo) << "wrote " << opts.out_path;
  return st;
}

Status run_hf(const HfOptions& opts) {
  ARBOR_ASSIGN_OR_RETURN(auto type, arbor::convert::parse_output_type(opts.type));
  ARBOR_ASSIGN_OR_RETURN(auto model, arbor::convert::load_hf(opts.dir));
  ARBOR_LOG(kInfo) << "hugging face checkpoint (" << model.weights.num_files()
                   << " safetensors file(s)): " << arbor::convert::describe_plan(model.plan, type);
  auto st = arbor::convert::write_plan(model.plan, type, opts.out_path);
  if (st.ok()) ARBOR_LOG(kInfo) << "wrote " << opts.out_path;
  return st;
}

std::string type_help() {
  return "Output type of 2-D weights: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, "
         "q4_K, q5_K, q6_K, or 'source' (keep F16/BF16 weights as stored). 1-D tensors are "
         "always f32; a weight whose row length does not fit the block size falls back as in "
         "llama.cpp";
}

void setup(CLI::App& app) {
  auto* convert = app.add_subcommand("convert", "Convert a checkpoint to GGUF");
  convert->require_subcommand(1);

  auto* l2c = convert->add_subcommand("llama2c", "Convert a llama2.c checkpoint + tokenizer.bin");
  auto lo = std::make_shared<Llama2cOptions>();
  l2c->add_option("model", lo->model_path, "llama2.c checkpoint (legacy or ak42 v1/v2)")
      ->required()
      ->check(CLI::ExistingFile);
  l2c->add_option("tokenizer", lo->tokenizer_path, "llama2.c tokenizer.bin")
      ->required()
      ->check(CLI::ExistingFile);
  l2c->add_option("-o,--output", lo->out_path, "Output GGUF file")->required();
  l2c->add_option("--type", lo->type, type_help())->capture_default_str();
  l2c->callback([lo] { arbor::cli::exit_on_error(run_llama2c(*lo)); });

  auto* hf = convert->add_subcommand(
      "hf", "Convert a Hugging Face safetensors directory (Llama, Qwen2/3, Gemma 2/3, "
            "Ministral 3, Phi-3, SmolLM3, OLMo 2, Granite)");
  auto ho = std::make_shared<HfOptions>();
  hf->add_option("dir", ho->dir, "Directory with config.json, *.safetensors, tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  hf->add_option("-o,--output", ho->out_path, "Output GGUF file")->required();
  hf->add_option("--type", ho->type, type_help())->capture_default_str();
  hf->callback([ho] { arbor::cli::exit_on_error(run_hf(*ho)); });
}

ARBOR_REGISTER_COMMAND(setup);

}  // namespace
