#include "server/engine_events.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/clock.h"
#include "base/check.h"
#include "base/status.h"

namespace arbor::server {

using nlohmann::json;

namespace {

json step_json(const engine::StepSummary& s, double steady_now) {
  return json{{"step", s.step},
              {"ago_s", std::max(0.0, steady_now - s.end_time_s)},
              {"duration_ms", s.duration_s * 1e3},
              {"requests", s.num_requests},
              {"prefill_requests", s.num_prefill_requests},
              {"prefill_tokens", s.num_prefill_tokens},
              {"decode_requests", s.num_decode_requests},
              {"new_requests", s.num_new_requests},
              {"draft_tokens", s.num_draft_tokens},
              {"tree_nodes", s.num_tree_nodes},
              {"accepted_tokens", s.num_accepted_tokens},
              {"generated_tokens", s.num_generated_tokens},
              {"preempted", s.num_preempted},
              {"kv_used_blocks", s.kv_used_blocks},
              {"kv_shared_blocks", s.kv_shared_blocks}};
}

json request_json(const engine::RequestSummary& r) {
  json acceptance = nullptr;
  if (r.num_draft_tokens > 0) {
    acceptance = static_cast<double>(r.num_accepted_tokens) / static_cast<double>(r.num_draft_tokens);
  }
  return json{{"id", r.id},
              {"state", std::string(sched::request_status_name(r.status))},
              {"samples", r.num_samples},
              {"priority", r.priority},
              {"age_s", r.age_s},
              {"prompt_tokens", r.num_prompt_tokens},
              {"cached_tokens", r.num_cached_tokens},
              {"computed_tokens", r.num_computed_tokens},
              {"output_tokens", r.num_output_tokens},
              {"draft_tokens", r.num_draft_tokens},
              {"accepted_tokens", r.num_accepted_tokens},
              {"acceptance", acceptance},
              {"step_drafts", r.num_step_drafts},
              {"pending_drafts", r.num_pending_drafts},
              {"draft_tree", r.draft_tree},
              {"preemptions", r.num_preemptions}};
}

double per_second(int64_t before, int64_t now, double seconds) {
  return seconds > 0 ? static_cast<double>(now - before) / seconds : 0.0;
}

}  // namespace

std::string engine_event_json(const EngineEventInput& in) {
  const engine::EngineMetricsSnapshot& m = *in.now;
  const engine::EngineMetricsSnapshot& b = *in.before;
  const engine::EngineActivity& a = *in.activity;
  const double steady_now = steady_seconds();
  json steps = json::array();
  int64_t skipped = 0;
  for (const engine::StepSummary& s : a.steps) {
    if (s.step <= in.after_step) continue;
    if (steps.empty()) skipped = s.step - in.after_step - 1;
    steps.push_back(step_json(s, steady_now));
  }
  json requests = json::array();
  for (const engine::RequestSummary& r : a.requests) requests.push_back(request_json(r));
  const double usage = a.kv.usable_blocks > 0 ? static_cast<double>(a.kv.used_blocks) /
                                                    static_cast<double>(a.kv.usable_blocks)
                                              : 0.0;
  json event = {
      {"object", "engine.event"},
      {"model", in.model},
      {"time", in.unix_time_s},
      {"interval_s", in.interval_s},
      {"running", m.num_running},
      {"waiting", m.num_waiting},
      {"kv",
       {{"usable_blocks", a.kv.usable_blocks},
        {"used_blocks", a.kv.used_blocks},
        {"shared_blocks", a.kv.shared_blocks},
        {"cached_blocks", a.kv.cached_blocks},
        {"usage", usage}}},
      {"prefix_cache_hit_rate", m.prefix_cache_hit_rate},
      {"throughput",
       {{"prompt_tokens_per_s", per_second(b.num_prompt_tokens, m.num_prompt_tokens, in.seconds)},
        {"generation_tokens_per_s",
         per_second(b.num_generation_tokens, m.num_generation_tokens, in.seconds)}}},
      {"totals",
       {{"steps", m.num_steps},
        {"requests_submitted", m.num_requests_submitted},
        {"requests_finished", m.num_requests_finished},
        {"requests_aborted", m.num_requests_aborted},
        {"prompt_tokens", m.num_prompt_tokens},
        {"generation_tokens", m.num_generation_tokens},
        {"preemptions", m.num_preemptions},
        {"draft_tokens", m.num_draft_tokens},
        {"accepted_draft_tokens", m.num_accepted_draft_tokens}}},
      {"spec_acceptance_estimate", m.spec_acceptance_estimate},
      {"steps_skipped", skipped},
      {"steps", std::move(steps)},
      {"requests", std::move(requests)}};
  return event.dump(-1, ' ', false, json::error_handler_t::replace);
}

EngineEvents::EngineEvents(http::HttpServer& http, const engine::Engine& engine,
                           std::string model, const EngineEventsOptions& options)
    : http_(http), engine_(engine), model_(std::move(model)), options_(options) {
  ARBOR_CHECK(options_.interval_s > 0 && options_.max_subscribers >= 1);
}

std::optional<ApiError> EngineEvents::subscribe(const std::shared_ptr<http::HttpExchange>& ex) {
  if (num_subscribers() >= options_.max_subscribers) {
    ApiError e;
    e.http_status = 429;
    e.type = "rate_limit_error";
    e.code = "too_many_subscribers";
    e.message = str_cat("at most ", options_.max_subscribers,
                        " engine event streams may be open at once; ", num_subscribers(),
                        " are open");
    return e;
  }
  if (subscribers_.empty()) {  // nothing measured since the last stream closed: start afresh
    before_ = engine_.metrics();
    now_ = before_;
    before_time_ = std::chrono::steady_clock::now();
    seconds_ = 0.0;
  }
  const engine::EngineActivity activity = engine_.activity();
  ex->start_stream(200, "text/event-stream");
  ex->write(event_body(0, activity));
  if (ex->disconnected()) return std::nullopt;
  const uint64_t id = next_id_++;
  subscribers_.push_back(Subscriber{id, ex, newest_step(activity, 0)});
  ex->set_on_disconnect([this, id] { unsubscribe(id); });
  schedule_tick();
  return std::nullopt;
}

void EngineEvents::unsubscribe(uint64_t id) {
  std::erase_if(subscribers_, [id](const Subscriber& s) { return s.id == id; });
}

void EngineEvents::close_all() {
  std::vector<Subscriber> closing = std::move(subscribers_);
  subscribers_.clear();
  for (Subscriber& s : closing) {
    s.ex->set_on_disconnect(nullptr);
    s.ex->finish_stream();
  }
}

void EngineEvents::schedule_tick() {
  if (tick_pending_ || subscribers_.empty()) return;
  tick_pending_ = true;
  http_.run_after(options_.interval_s, [this] { tick(); });
}

int64_t EngineEvents::newest_step(const engine::EngineActivity& activity, int64_t last) {
  return activity.steps.empty() ? last : std::max(last, activity.steps.back().step);
}

void EngineEvents::tick() {
  tick_pending_ = false;
  if (subscribers_.empty()) return;
  before_ = std::move(now_);
  now_ = engine_.metrics();
  const auto t = std::chrono::steady_clock::now();
  seconds_ = std::chrono::duration<double>(t - before_time_).count();
  before_time_ = t;
  const engine::EngineActivity activity = engine_.activity();
  // Streams at the same point share one body (after their first event, all of them). A copy:
  // a write may close its connection and so unsubscribe it.
  const std::vector<Subscriber> current = subscribers_;
  std::vector<std::pair<int64_t, std::string>> bodies;
  for (const Subscriber& s : current) {
    size_t i = 0;
    while (i < bodies.size() && bodies[i].first != s.last_step) ++i;
    if (i == bodies.size()) bodies.emplace_back(s.last_step, event_body(s.last_step, activity));
    s.ex->write(bodies[i].second);
  }
  for (Subscriber& s : subscribers_) s.last_step = newest_step(activity, s.last_step);
  schedule_tick();
}

std::string EngineEvents::event_body(int64_t after_step, const engine::EngineActivity& activity) {
  EngineEventInput in;
  in.model = model_;
  in.unix_time_s = std::chrono::duration<double>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  in.interval_s = options_.interval_s;
  in.before = &before_;
  in.now = &now_;
  in.seconds = seconds_;
  in.activity = &activity;
  in.after_step = after_step;
  return str_cat("data: ", engine_event_json(in), "\n\n");
}

}  // namespace arbor::server
