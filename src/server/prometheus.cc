#include "server/prometheus.h"

#include <cstdio>
#include <string_view>
#include <utility>

#include "base/status.h"

namespace arbor::server {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// Prometheus label values escape backslash, double quote and newline.
std::string label_value(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// The exposition being written. Every sample carries the model_name label, as vLLM's do.
struct Out {
  std::string text;
  std::string model_label;  // model_name="..."
};

void header(Out& out, const char* name, const char* type, const char* help) {
  out.text += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

// One sample; `labels`: its own labels before model_name ("code=\"200\""), or "".
void sample(Out& out, std::string_view name, std::string_view labels, std::string_view value) {
  out.text += str_cat(name, "{", labels, labels.empty() ? "" : ",", out.model_label, "} ", value,
                      "\n");
}

void scalar(Out& out, const char* name, const char* type, const char* help, double v) {
  header(out, name, type, help);
  sample(out, name, "", num(v));
}

// Model shards (docs/shards.md): per shard, labelled shard="<rank>"; the fault counters and the
// health gauge also without shards (0 and 1).
void shards(Out& out, const engine::EngineMetricsSnapshot& m) {
  struct Field {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const step::ShardStats&);
  };
  static const Field kFields[] = {
      {"arbor_shard_up", "gauge", "1 when the shard answered its last message.",
       [](const step::ShardStats& s) { return s.up ? 1.0 : 0.0; }},
      {"arbor_shard_incarnation", "gauge", "The shard's incarnation (1 + its restarts).",
       [](const step::ShardStats& s) { return static_cast<double>(s.incarnation); }},
      {"arbor_shard_steps_total", "counter", "Steps the shard answered.",
       [](const step::ShardStats& s) { return static_cast<double>(s.num_steps); }},
      {"arbor_shard_step_seconds_total", "counter",
       "Wall time of the shard's steps as the engine saw them.",
       [](const step::ShardStats& s) { return s.step_s; }},
      {"arbor_shard_forward_seconds_total", "counter",
       "Time the shard spent executing its steps (forward, sampling, proposing).",
       [](const step::ShardStats& s) { return s.forward_s; }},
      {"arbor_shard_wait_seconds_total", "counter",
       "Step time outside the shard's execution: encoding, transport, decoding, validation.",
       [](const step::ShardStats& s) { return s.wait_s; }},
      {"arbor_shard_last_step_seconds", "gauge", "The latest step's wall time.",
       [](const step::ShardStats& s) { return s.last_step_s; }},
      {"arbor_shard_last_wait_seconds", "gauge", "The latest step's control-plane time.",
       [](const step::ShardStats& s) { return s.last_wait_s; }},
      {"arbor_shard_faults_total", "counter",
       "The shard's deaths, hangs and refused or malformed messages.",
       [](const step::ShardStats& s) { return static_cast<double>(s.num_faults); }},
      {"arbor_shard_restarts_total", "counter", "New incarnations of the shard brought up.",
       [](const step::ShardStats& s) { return static_cast<double>(s.num_restarts); }},
  };
  for (const Field& f : kFields) {
    if (m.shards.empty()) break;
    header(out, f.name, f.type, f.help);
    for (const step::ShardStats& s : m.shards) {
      sample(out, f.name, str_cat("shard=\"", s.rank, "\""), num(f.get(s)));
    }
  }
  scalar(out, "arbor_executor_faults_total", "counter",
         "Steps the executor lost (a shard died, hung or refused a message).",
         static_cast<double>(m.num_executor_faults));
  scalar(out, "arbor_executor_recoveries_total", "counter",
         "Faults after which a new shard incarnation took over.",
         static_cast<double>(m.num_executor_recoveries));
  scalar(out, "arbor_executor_healthy", "gauge",
         "0 after a fault the executor could not recover from, until a step runs again.",
         m.executor_healthy ? 1.0 : 0.0);
}

// Engine histograms keep per-bucket counts; Prometheus wants cumulative ones plus +Inf.
void histogram(Out& out, const char* name, const char* help, const engine::Histogram& h) {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  const auto& counts = h.counts();
  const std::string bucket = str_cat(name, "_bucket");
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    cumulative += i < counts.size() ? counts[i] : 0;
    sample(out, bucket, str_cat("le=\"", num(h.bounds()[i]), "\""), str_cat(cumulative));
  }
  sample(out, bucket, "le=\"+Inf\"", str_cat(h.count()));
  sample(out, str_cat(name, "_sum"), "", num(h.sum()));
  sample(out, str_cat(name, "_count"), "", str_cat(h.count()));
}

// Per KV cache group (docs/kv_layout.md): group="0", window="0" (full attention) or the window.
void kv_groups(Out& out, const engine::EngineMetricsSnapshot& m) {
  const auto labels = [&](size_t g) {
    const int32_t w = g < m.kv_group_windows.size() ? m.kv_group_windows[g] : 0;
    return str_cat("group=\"", g, "\",window=\"", w, "\"");
  };
  header(out, "arbor_kv_group_blocks_used", "gauge",
         "KV blocks held by a KV cache group's block tables (they share one pool).");
  for (size_t g = 0; g < m.kv_group_used_blocks.size(); ++g) {
    sample(out, "arbor_kv_group_blocks_used", labels(g), str_cat(m.kv_group_used_blocks[g]));
  }
  header(out, "arbor_kv_group_blocks_released_total", "counter",
         "KV blocks a sliding-window group released: they left every query's window.");
  for (size_t g = 0; g < m.kv_group_released_blocks.size(); ++g) {
    sample(out, "arbor_kv_group_blocks_released_total", labels(g),
           str_cat(m.kv_group_released_blocks[g]));
  }
}

void speculation(Out& out, const engine::EngineMetricsSnapshot& m) {
  scalar(out, "arbor_spec_draft_tokens_total", "counter", "Speculative draft tokens verified.",
         m.num_draft_tokens);
  scalar(out, "arbor_spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
         m.num_accepted_draft_tokens);
  scalar(out, "arbor_spec_verify_steps_total", "counter",
         "Verifications (a request's step with at least one draft).", m.num_verify_steps);
  scalar(out, "arbor_spec_recovered_tokens_total", "counter",
         "Tokens sampled from the target after a rejected draft.", m.num_recovered_tokens);
  scalar(out, "arbor_spec_bonus_tokens_total", "counter",
         "Tokens sampled from the target after every draft was accepted.", m.num_bonus_tokens);
  scalar(out, "arbor_spec_mean_accepted_length", "gauge",
         "Mean tokens emitted per verification (accepted drafts + 1).",
         m.num_verify_steps > 0
             ? 1.0 + static_cast<double>(m.num_accepted_draft_tokens) / m.num_verify_steps
             : 0.0);
  scalar(out, "arbor_spec_tree_verify_steps_total", "counter",
         "Verifications of a token tree (--spec-tree-budget).", m.num_tree_verify_steps);
  scalar(out, "arbor_spec_tree_nodes_total", "counter", "Token-tree nodes verified.",
         m.num_tree_nodes);
  scalar(out, "arbor_spec_tree_accepted_tokens_total", "counter",
         "Draft tokens accepted from token trees.", m.num_tree_accepted_tokens);
  scalar(out, "arbor_spec_tree_mean_accepted_length", "gauge",
         "Mean tokens emitted per token-tree verification (accepted path + 1).",
         m.num_tree_verify_steps > 0 ? 1.0 + static_cast<double>(m.num_tree_accepted_tokens) /
                                                 static_cast<double>(m.num_tree_verify_steps)
                                     : 0.0);
  header(out, "arbor_spec_acceptance_by_position", "gauge",
         "Accepted / verified drafts at each draft position (0 = the first draft; a token "
         "tree's depth - 1).");
  for (size_t i = 0; i < m.drafts_at_position.size(); ++i) {
    if (m.drafts_at_position[i] == 0) continue;
    sample(out, "arbor_spec_acceptance_by_position", str_cat("position=\"", i, "\""),
           num(static_cast<double>(m.accepted_at_position[i]) /
               static_cast<double>(m.drafts_at_position[i])));
  }
  scalar(out, "arbor_spec_decisions_total", "counter",
         "Requests with drafts the policy considered, per step.", m.num_spec_candidates);
  scalar(out, "arbor_spec_declined_total", "counter",
         "... of which the policy verified none (speculation did not pay).", m.num_spec_declined);
  scalar(out, "arbor_spec_acceptance_estimate", "gauge",
         "The speculation policy's engine-wide acceptance estimate.", m.spec_acceptance_estimate);
  scalar(out, "arbor_spec_probes_total", "counter",
         "Steps that proposed or verified drafts although none paid, to keep learning.",
         m.num_spec_probes);
  scalar(out, "arbor_spec_served_steepness", "gauge",
         "The step-cost curve's steepness served steps show, relative to the startup "
         "measurement (1: as measured).",
         m.spec_steepness);
  scalar(out, "arbor_spec_overhead", "gauge",
         "What a speculative step costs beyond the curve, in 1-token steps.", m.spec_overhead);
}

}  // namespace

std::string prometheus_text(const engine::EngineMetricsSnapshot& m, const ServerMetrics& s) {
  Out out;
  out.model_label = str_cat("model_name=\"", label_value(s.model_name), "\"");
  histogram(out, "arbor_time_to_first_token_seconds", "Arrival to first generated token.",
            m.ttft_s);
  histogram(out, "arbor_inter_token_latency_seconds", "Time between tokens of a sample.",
            m.inter_token_s);
  histogram(out, "arbor_e2e_request_latency_seconds", "Arrival to finish.", m.e2e_s);
  histogram(out, "arbor_request_queue_time_seconds", "Arrival to first scheduled.", m.queue_time_s);
  histogram(out, "arbor_batch_size", "Requests scheduled per engine step.", m.batch_size);
  histogram(out, "arbor_tokens_per_step", "Tokens scheduled per engine step.", m.tokens_per_step);
  scalar(out, "arbor_num_requests_running", "gauge", "Requests running in the engine.",
         m.num_running);
  scalar(out, "arbor_num_requests_waiting", "gauge", "Requests waiting in the engine.",
         m.num_waiting);
  scalar(out, "arbor_kv_cache_usage_perc", "gauge", "Used KV blocks / usable blocks (0-1).",
         m.kv_usage);
  scalar(out, "arbor_kv_blocks_usable", "gauge", "Usable KV blocks.", s.kv_blocks_total);
  scalar(out, "arbor_kv_blocks_free", "gauge", "Free KV blocks (prefix-cached ones included).",
         s.kv_blocks_free);
  scalar(out, "arbor_kv_blocks_used", "gauge", "KV blocks held by requests.",
         s.kv_blocks_total - s.kv_blocks_free);
  kv_groups(out, m);
  scalar(out, "arbor_prefix_cache_hit_rate", "gauge", "Prefix-cache hit tokens / queried tokens.",
         m.prefix_cache_hit_rate);
  scalar(out, "arbor_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", m.num_prefix_cache_query_tokens);
  scalar(out, "arbor_prefix_cache_hits_total", "counter",
         "Prompt tokens served from cached KV blocks.", m.num_prefix_cache_hit_tokens);
  scalar(out, "arbor_state_checkpoints", "gauge",
         "Recurrent states held at prompts' block boundaries (hybrid models' prefix caching).",
         m.num_state_checkpoints);
  scalar(out, "arbor_state_checkpoint_saves_total", "counter",
         "Recurrent states saved at a prompt's block boundary.", m.num_state_checkpoint_saves);
  scalar(out, "arbor_state_checkpoint_hits_total", "counter",
         "Admissions that continued a saved recurrent state.", m.num_state_checkpoint_hits);
  scalar(out, "arbor_http_active_requests", "gauge", "Generation requests being answered.",
         s.active_requests);
  scalar(out, "arbor_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         m.num_prompt_tokens);
  scalar(out, "arbor_generation_tokens_total", "counter", "Generated tokens.",
         m.num_generation_tokens);
  scalar(out, "arbor_num_preemptions_total", "counter", "Preemptions.", m.num_preemptions);
  scalar(out, "arbor_num_priority_preemptions_total", "counter",
         "Preemptions made for a more important waiting request (priority policy).",
         m.num_priority_preemptions);
  scalar(out, "arbor_request_submitted_total", "counter", "Requests admitted by the engine.",
         m.num_requests_submitted);
  scalar(out, "arbor_request_finished_total", "counter", "Requests finished (aborted included).",
         m.num_requests_finished);
  scalar(out, "arbor_request_aborted_total", "counter", "Requests aborted.", m.num_requests_aborted);
  scalar(out, "arbor_request_rejected_total", "counter", "Requests rejected by the engine.",
         m.num_requests_rejected);
  scalar(out, "arbor_engine_steps_total", "counter", "Engine steps.", m.num_steps);
  speculation(out, m);
  shards(out, m);
  header(out, "arbor_http_requests_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, count] : s.responses_by_status) {
    sample(out, "arbor_http_requests_total", str_cat("code=\"", code, "\""), str_cat(count));
  }
  return std::move(out.text);
}

}  // namespace arbor::server
