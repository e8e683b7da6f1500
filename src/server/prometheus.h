// Prometheus text exposition (format 0.0.4) of the engine's metrics snapshot plus the server's
// own counters, for GET /metrics. Names follow vLLM where one exists (arbor_ prefix), and every
// sample carries the label model_name="<the served name>" as vLLM's do:
//   histograms  arbor_time_to_first_token_seconds, arbor_inter_token_latency_seconds,
//               arbor_e2e_request_latency_seconds, arbor_request_queue_time_seconds,
//               arbor_batch_size, arbor_tokens_per_step
//   gauges      arbor_num_requests_running, arbor_num_requests_waiting, arbor_kv_cache_usage_perc,
//               arbor_kv_blocks_usable, arbor_kv_blocks_free, arbor_kv_blocks_used,
//               arbor_prefix_cache_hit_rate, arbor_http_active_requests,
//               arbor_kv_group_blocks_used{group="g",window="w"} (per KV cache group)
//   counters    arbor_prompt_tokens_total, arbor_generation_tokens_total,
//               arbor_num_preemptions_total, arbor_request_success_total, ...,
//               arbor_kv_group_blocks_released_total{group="g",window="w"},
//               arbor_http_requests_total{code="..."}
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/metrics.h"

namespace arbor::server {

struct ServerMetrics {
  std::string model_name;        // the served model name (the first --served-model-name)
  int64_t kv_blocks_total = 0;   // usable blocks in the pool
  int64_t kv_blocks_free = 0;    // free as of the engine's last step (cached blocks count free)
  int64_t active_requests = 0;   // generation requests the server is answering
  std::map<int, int64_t> responses_by_status;  // HTTP status -> responses sent
};

std::string prometheus_text(const engine::EngineMetricsSnapshot& m, const ServerMetrics& s);

}  // namespace arbor::server
