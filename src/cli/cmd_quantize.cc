// `arbor quantize IN.gguf OUT.gguf TYPE`: re-encodes a model's weight matrices to TYPE or a
// K-quant mixture such as q4_K_M (see gguf/quantize_model.h for which tensors change) and writes
// a new GGUF file, converting one tensor at a time as it writes (a 30B model needs one tensor's
// worth of memory, not the output's), on every core, with a progress bar.
#include <cstdio>
#include <memory>
#include <string>

#include "base/log.h"
#include "cli/command.h"
#include "gguf/gguf.h"
#include "gguf/quantize_model.h"

namespace arbor::cli {
namespace cmd_quantize {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string input;
  std::string output;
  std::string type;
  int threads = 0;
};

Status run(const Options& opts) {
  auto target = gguf::parse_quantize_recipe(opts.type);
  if (!target.ok()) return target.status();
  if (opts.input == opts.output) {
    return invalid_argument("output ", opts.output, " would overwrite the input");
  }
  auto in = gguf::GgufFile::open(opts.input);
  if (!in.ok()) return in.status();
  gguf::QuantizeOptions options;
  options.target = target->type;
  options.mix = target->mix;
  options.threads = opts.threads;
  gguf::QuantizeReport report;
  auto writer = gguf::quantize_model(*in, options, &report);
  if (!writer.ok()) return writer.status().with_context(opts.input);
  if (Status s = writer->write(opts.output); !s.ok()) return s;
  std::fprintf(stderr,
               "quantized %s -> %s (%s): %lld tensors converted (%lld with a fallback type), "
               "%lld kept; tensor data %.2f MiB -> %.2f MiB\n",
               opts.input.c_str(), opts.output.c_str(),
               gguf::recipe_name(*target).c_str(),
               static_cast<long long>(report.num_converted),
               static_cast<long long>(report.num_fallback),
               static_cast<long long>(report.num_kept), report.bytes_in / 1048576.0,
               report.bytes_out / 1048576.0);
  return ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("quantize", "Re-encode a GGUF model's weights to another type");
  auto opts = std::make_shared<Options>();
  sub->add_option("input", opts->input, "Input GGUF file")->required();
  sub->add_option("output", opts->output, "Output GGUF file")->required();
  sub->add_option("type", opts->type,
                  "Target type: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, "
                  "q5_K, q6_K, iq4_nl, iq4_xs, mxfp4 (every weight matrix), or a mixture like "
                  "llama-quantize's: q3_K_S, q3_K_M, q3_K_L, q4_K_S, q4_K_M, q5_K_S, q5_K_M "
                  "(output.weight q6_K, more bits for some attn_v / ffn_down / attn_output "
                  "layers), mxfp4_moe (expert tensors mxfp4, other matrices q8_0)")
      ->required();
  sub->add_option("-t,--threads", opts->threads,
                  "Threads encoding each tensor's rows (0: every core); the output does not "
                  "depend on it")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  sub->callback([opts] { exit_on_error(run(*opts)); });
}
ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
