#include "shard/launch.h"

namespace arbor::shard {

std::vector<std::string> shard_command_line(const std::string& binary, const std::string& model,
                                            const executor::ExecutorOptions& e,
                                            std::string_view log_level) {
  std::vector<std::string> argv = {binary, "shard", "-m", model,
                                   "--log-level", std::string(log_level),
                                   "--device", std::string(executor::device_name(e.device)),
                                   "--cuda-device", std::to_string(e.cuda_device),
                                   "--block-size", std::to_string(e.block_size),
                                   "--kv-cache-gib", std::to_string(e.kv_cache_gib),
                                   "--num-kv-blocks", std::to_string(e.num_kv_blocks),
                                   "--kv-dtype", e.kv_dtype == kernels::KvDtype::kF32 ? "f32" : "f16",
                                   "-t", std::to_string(e.num_threads),
                                   "--max-num-batched-tokens", std::to_string(e.reserve_tokens),
                                   "--max-num-seqs", std::to_string(e.max_num_seqs),
                                   "--state-checkpoints", std::to_string(e.state_checkpoints),
                                   "--spec", std::string(executor::spec_proposer_name(e.proposer)),
                                   "--spec-ngram-min", std::to_string(e.ngram_min),
                                   "--spec-ngram-max", std::to_string(e.ngram_max),
                                   "--spec-tree-budget", std::to_string(e.tree_budget),
                                   "--spec-tree-width", std::to_string(e.tree_width)};
  if (!e.kv_reclaim) argv.push_back("--no-kv-reclaim");
  if (!e.draft_model.empty()) argv.insert(argv.end(), {"--draft-model", e.draft_model});
  static const char* const kTreeSampling[] = {"topk", "specinfer", "sequoia"};
  argv.insert(argv.end(),
              {"--spec-tree-sampling", kTreeSampling[static_cast<int>(e.tree_sampling)]});
  if (!e.tree_static_widths.empty()) {
    std::string widths;
    for (int32_t w : e.tree_static_widths) widths += (widths.empty() ? "" : ",") + std::to_string(w);
    argv.insert(argv.end(), {"--spec-tree-shape", widths});
  }
  return argv;
}

}  // namespace arbor::shard
