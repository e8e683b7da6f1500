// EngineCore's thread-safe surface: streams, submit, abort, construction and shutdown. The
// engine thread's loop is in engine_loop.cc.
#include <algorithm>
#include <chrono>
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "engine/engine_core.h"
#include "engine/stop_rules.h"

namespace arbor::engine {

std::optional<StreamEvent> RequestStream::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (final_popped_) return std::nullopt;
  cv_.wait(lock, [this] { return !queue_.empty(); });
  StreamEvent e = std::move(queue_.front());
  queue_.pop_front();
  if (e.final) final_popped_ = true;
  return e;
}

std::optional<StreamEvent> RequestStream::next_for(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (final_popped_) return std::nullopt;
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                    [this] { return !queue_.empty(); })) {
    return std::nullopt;
  }
  StreamEvent e = std::move(queue_.front());
  queue_.pop_front();
  if (e.final) final_popped_ = true;
  return e;
}

std::optional<StreamEvent> RequestStream::try_next() {
  std::lock_guard<std::mutex> lock(mu_);
  if (final_popped_ || queue_.empty()) return std::nullopt;
  StreamEvent e = std::move(queue_.front());
  queue_.pop_front();
  if (e.final) final_popped_ = true;
  return e;
}

void RequestStream::set_notify(std::function<void()> notify) {
  bool pending = false;
  std::function<void()> copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify_ = std::move(notify);
    pending = !queue_.empty();
    copy = notify_;
  }
  if (pending && copy) copy();
}

void RequestStream::push(StreamEvent event) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ARBOR_CHECK(!final_pushed_) << "event pushed after the final one for " << request_id_;
    final_pushed_ = event.final;
    queue_.push_back(std::move(event));
    notify = notify_;
  }
  cv_.notify_one();
  if (notify) notify();
}

namespace {

sched::SchedulerOptions scheduler_options(const EngineOptions& o, int64_t max_model_len,
                                          int32_t vocab_size) {
  sched::SchedulerOptions s;
  s.max_model_len = max_model_len;
  s.max_num_seqs = o.max_num_seqs;
  s.max_num_batched_tokens = o.max_num_batched_tokens;
  s.long_prefill_token_threshold = o.long_prefill_token_threshold;
  s.max_waiting_requests = o.max_waiting_requests;
  s.policy = o.policy;
  s.max_spec_tokens = o.max_spec_tokens;
  s.vocab_size = vocab_size;
  return s;
}

}  // namespace

Status EngineCore::validate_config(const step::ModelExecutor& executor,
                                  const EngineCoreConfig& config) {
  const int32_t k = config.options.max_spec_tokens;
  if (k < 0 || k > sched::kMaxSpecTokens) {
    return invalid_argument("--spec-k is ", k, ", must be in [0, ", sched::kMaxSpecTokens, "]");
  }
  if (k > 0 && !executor.has_proposer()) {
    return invalid_argument("--spec-k is ", k, " but the executor has no proposer (--spec)");
  }
  return executor.check_max_model_len(config.options.max_model_len);
}

namespace {

// The steps to measure: the curve's sizes with distinct tokens, and for a mixture a second series
// of the same sizes (2..32) with one token repeated (few experts), which separates the cost of an
// expert from the cost of a row (docs/speculation.md, "the expert term").
std::vector<step::StepCostProbe> cost_probes(std::span<const int32_t> sizes,
                                             const step::ExpertShape& shape) {
  std::vector<step::StepCostProbe> probes;
  for (int32_t n : sizes) probes.push_back({.num_tokens = n});
  if (shape.num_experts > shape.num_used) {
    for (int32_t n : sizes) {
      if (n >= 2 && n <= 32) probes.push_back({.num_tokens = n, .repeat_token = true});
    }
  }
  return probes;
}

// The mixture's expert term from the two measured series, logged with what it was fitted from
// (or why it is off).
void add_expert_term(const step::ExpertShape& shape,
                     std::span<const sched::ExpertCostPoint> distinct,
                     std::span<const sched::ExpertCostPoint> repeated,
                     sched::SpecCostModel& model) {
  model.experts.num_experts = shape.num_experts;
  model.experts.num_used = shape.num_used;
  model.experts.cost_per_expert = sched::fit_cost_per_expert(distinct, repeated);
  std::string pairs;
  for (const sched::ExpertCostPoint& r : repeated) {
    for (const sched::ExpertCostPoint& d : distinct) {
      if (d.num_tokens != r.num_tokens || d.num_tokens > 8) continue;
      pairs += str_cat(" ", d.num_tokens, " rows: ", d.cost, " at ", d.touched, " experts vs ",
                       r.cost, " at ", r.touched, ";");
    }
  }
  const sched::SpecCostModel::Experts& e = model.experts;
  if (!e.active()) {
    ARBOR_LOG(kInfo) << "speculation: " << e.num_experts << " experts, " << e.num_used
                     << " per token; no expert term (distinct and repeated tokens touched "
                     << "about as many experts or cost the same:" << pairs
                     << "); the curve alone prices drafts";
    return;
  }
  ARBOR_LOG(kInfo) << "speculation: expert term " << e.cost_per_expert
                   << " of a 1-token step per distinct expert per layer (" << e.num_experts
                   << " experts, " << e.num_used << " per token; measured" << pairs
                   << " routing spread rho " << model.measured_rho()
                   << "); the policy prices drafts by the experts their rows add";
}

// The step sizes the SpecPolicy's cost curve is measured at: dense where drafts live, sparse
// up to the step budget (at most 128 tokens: beyond, a step is compute-bound and the curve is
// extrapolated linearly).
std::vector<int32_t> cost_curve_sizes(int32_t budget, int64_t max_model_len) {
  std::vector<int32_t> sizes;
  for (int32_t n : {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128}) {
    if (n <= std::max(budget, 2) && n < max_model_len) sizes.push_back(n);
  }
  return sizes;
}

}  // namespace

sched::SpecCostModel EngineCore::measure_spec_costs() {
  sched::SpecCostModel best = measure_spec_costs_once();
  for (int tries = 1; tries < kCurveTries && best.experts.one_token_share() > 1.0; ++tries) {
    ARBOR_LOG(kWarn) << "speculation: the measured curve is impossible (the "
                     << best.experts.num_used << " experts of a 1-token step alone would cost "
                     << best.experts.one_token_share()
                     << " steps: the machine stalled while measuring); measuring again";
    sched::SpecCostModel again = measure_spec_costs_once();
    if (again.experts.one_token_share() < best.experts.one_token_share()) best = std::move(again);
  }
  if (best.experts.one_token_share() > 1.0) {
    ARBOR_LOG(kWarn) << "speculation: every measured curve was impossible; keeping the one whose "
                     << "experts cost least (" << best.experts.one_token_share()
                     << " steps): drafts will look dearer than they are";
  }
  return best;
}

sched::SpecCostModel EngineCore::measure_spec_costs_once() {
  sched::SpecCostModel model;
  const std::vector<int32_t> sizes =
      cost_curve_sizes(config_.options.max_num_batched_tokens, max_model_len_);
  const step::ExpertShape shape = executor_->expert_shape();
  const std::vector<step::StepCostProbe> probes = cost_probes(sizes, shape);
  Result<std::vector<step::StepCostSample>> costs = executor_->measure_step_costs(probes);
  if (!costs.ok() || costs->size() != probes.size() || (*costs)[0].seconds <= 0) {
    ARBOR_LOG(kWarn) << "speculation: could not measure step costs ("
                     << (costs.ok() ? std::string("an incomplete answer")
                                    : costs.status().to_string())
                     << "); planning as if extra tokens were free";
    return model;
  }
  const double one = (*costs)[0].seconds;
  std::vector<sched::ExpertCostPoint> distinct, repeated;
  for (size_t i = 0; i < probes.size(); ++i) {
    const step::StepCostSample& c = (*costs)[i];
    const sched::ExpertCostPoint p{probes[i].num_tokens, c.seconds / one, c.experts_touched};
    (probes[i].repeat_token ? repeated : distinct).push_back(p);
  }
  // Each series in order of size, made nondecreasing (a larger step never costs less: a lower
  // median is the machine's noise, and a dip would make the policy prefer its size).
  std::string raw;
  for (std::vector<sched::ExpertCostPoint>* series : {&distinct, &repeated}) {
    std::vector<double> c;
    for (const sched::ExpertCostPoint& p : *series) c.push_back(p.cost);
    const std::vector<double> fit = sched::nondecreasing_fit(c);
    for (size_t i = 0; i < fit.size(); ++i) {
      sched::ExpertCostPoint& p = (*series)[i];
      if (fit[i] != p.cost && series == &distinct) raw += str_cat(" r(", p.num_tokens, ")=", p.cost);
      p.cost = fit[i];
    }
  }
  std::string curve;
  for (size_t i = 0; i < distinct.size(); ++i) {
    const sched::ExpertCostPoint& p = distinct[i];
    model.points.emplace_back(p.num_tokens, p.cost);
    model.experts.touched.push_back(p.touched);
    if (p.num_tokens <= 16 || i + 1 == distinct.size()) {
      curve += str_cat(" r(", p.num_tokens, ")=", p.cost);
    }
  }
  if (!raw.empty()) {
    ARBOR_LOG(kDebug) << "speculation: step costs measured below a smaller step's were pooled with "
                      << "it (nondecreasing fit); measured" << raw;
  }
  model.draft_cost = executor_->draft_token_cost() / one;
  model.one_token_seconds = one;
  const int32_t tree = executor_->max_tree_nodes();
  ARBOR_LOG(kInfo) << "speculation: up to " << config_.options.max_spec_tokens
                   << (tree > 0 ? str_cat(" levels of token trees of up to ", tree, " nodes")
                                : std::string(" drafts"))
                   << " per request, chosen each step by goodput; 1-token step " << one * 1e3
                   << " ms, step cost" << curve << ", draft token cost " << model.draft_cost;
  if (shape.num_experts > shape.num_used) add_expert_term(shape, distinct, repeated, model);
  return model;
}

namespace {

// How the KV cache groups share the pool, and what one request at max_model_len holds.
void log_kv_groups(const kv::KvCacheManager& kv, int64_t max_model_len) {
  std::string groups;
  for (int32_t w : kv.group_windows()) {
    groups += groups.empty() ? "" : ", ";
    groups += w == 0 ? std::string("full") : str_cat("window ", w);
  }
  const int64_t one_group = (max_model_len + kv.block_size() - 1) / kv.block_size();
  ARBOR_LOG(kInfo) << "kv cache: " << kv.num_groups() << " groups (" << groups << ") share "
                   << kv.block_pool().num_usable_blocks() << " blocks of " << kv.block_size()
                   << " tokens, each group's tables taking blocks as its requests need them; a "
                   << max_model_len << "-token request holds at most "
                   << kv.max_blocks_per_request(max_model_len, 1) << " blocks (at one token per "
                   << "step) where keeping every block would take " << one_group * kv.num_groups();
}

// A resumed request's own rules (GenerateRequest::resume); the scheduler's spec validation
// checks the rest (ids, n, max_tokens).
Status check_resume(const GenerateRequest& request, int64_t num_prompt_tokens,
                    int64_t max_model_len, int32_t vocab_size) {
  const ResumeFrom& r = *request.resume;
  if (r.output_token_ids.empty()) return invalid_argument("resume has no output tokens");
  for (size_t i = 0; i < r.output_token_ids.size(); ++i) {
    const int32_t id = r.output_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return invalid_argument("resumed token ", i, " is ", id, ", vocabulary size is ", vocab_size);
    }
  }
  if (!request.sampling.seed && !request.sampling.greedy()) {
    return invalid_argument("a resumed sampled request needs its seed: the continuation of a "
                            "random one would not be the tokens the client was being sent");
  }
  const auto k = static_cast<int64_t>(r.output_token_ids.size());
  if (num_prompt_tokens + k >= max_model_len) {
    return invalid_argument("resumed at ", num_prompt_tokens, " prompt + ", k,
                            " generated tokens, max_model_len is ", max_model_len,
                            ": the sample had reached it");
  }
  return ok_status();
}

// The resumed sample's text state: the prompt's tail primes the detokenizer, then the resumed
// tokens are replayed (checked against the bytes the client received).
Result<SampleText> resume_text(const tokenizer::Tokenizer& tokenizer,
                               const GenerateRequest& request, const sched::RequestSpec& spec) {
  std::vector<int32_t> keep = request.keep_special_ids;
  std::sort(keep.begin(), keep.end());
  const std::vector<int32_t>& prompt = spec.prompt_token_ids;
  const size_t tail = std::min(prompt.size(), SampleText::kPrimeTokens);
  return SampleText::replay(tokenizer, std::span(prompt).last(tail), request.stop,
                            std::move(keep), request.resume->output_token_ids,
                            request.resume->text_bytes);
}

}  // namespace

EngineCore::EngineCore(std::unique_ptr<step::ModelExecutor> executor, const EngineCoreConfig& config)
    : executor_(std::move(executor)), config_(config), vocab_size_(executor_->vocab_size()) {
  if (config_.eos_token_ids) {
    eos_ids_ = *config_.eos_token_ids;
  } else if (config_.tokenizer != nullptr) {
    eos_ids_ = default_stop_token_ids(*config_.tokenizer);
  }
  const int64_t limit = executor_->max_model_len();
  max_model_len_ = config_.options.max_model_len > 0 ? config_.options.max_model_len : limit;
  ARBOR_CHECK(max_model_len_ > 0 && max_model_len_ <= limit)
      << "max_model_len " << max_model_len_ << ", the executor runs at most " << limit;
  kv::KvCacheManagerOptions ko;
  ko.num_blocks = static_cast<int32_t>(executor_->num_kv_blocks());
  ko.block_size = executor_->block_size();
  const int32_t state_slots = executor_->recurrent_state_slots();
  const int32_t checkpoints = state_slots > 0 ? executor_->state_checkpoints() : 0;
  ko.enable_prefix_caching =
      config_.options.enable_prefix_caching && (state_slots == 0 || checkpoints > 0);
  if (state_slots > 0 && config_.options.enable_prefix_caching) {
    if (checkpoints == 0) {
      ARBOR_LOG(kInfo) << "prefix caching: off, the model's recurrent layers keep no state at "
                          "block boundaries (--state-checkpoints 0: a cached prefix would have no "
                          "state to continue from)";
    } else {
      ARBOR_LOG(kInfo) << "prefix caching: hits end where a recurrent state is saved: each "
                          "prompt's last full block boundary, "
                       << checkpoints << " states kept (--state-checkpoints, least recently "
                                         "used out)";
    }
  }
  ko.group_windows = executor_->kv_group_windows();
  kv_ = std::make_unique<kv::KvCacheManager>(ko);
  if (config_.kv_events != nullptr) kv_->record_kv_events(true);
  if (kv_->num_groups() > 1 || ko.group_windows[0] > 0) log_kv_groups(*kv_, max_model_len_);
  num_free_blocks_ = kv_->num_free_blocks();
  sched::SchedulerOptions so = scheduler_options(config_.options, max_model_len_, vocab_size_);
  so.state_checkpoints = checkpoints;
  if (state_slots > 0 && so.max_num_seqs > state_slots) {
    ARBOR_LOG(kWarn) << "max_num_seqs " << so.max_num_seqs << " lowered to the executor's "
                     << state_slots << " recurrent state slots";
    so.max_num_seqs = state_slots;
  }
  if (so.max_spec_tokens > 0) {
    so.spec_cost = measure_spec_costs();
    so.reserve_draft_slots = executor_->proposer_writes_kv();
    so.draft_keeps_up = executor_->proposer_keeps_up();
    so.max_tree_nodes = executor_->max_tree_nodes();
  }
  scheduler_ = std::make_unique<sched::Scheduler>(so, *kv_);
  outputs_ = std::make_unique<OutputProcessor>(
      config_.tokenizer, metrics_, [this](const std::string& name) { release_name(name); });
  publish_metrics();  // readers see the idle engine's pool before its first step
  thread_ = std::thread([this] { run(); });
}

EngineCore::~EngineCore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.stop = true;
  }
  cv_.notify_all();
  thread_.join();
}

Result<std::shared_ptr<RequestStream>> EngineCore::submit(GenerateRequest request) {
  if (request.pooling) {
    request.max_tokens = 0;
    request.n = 1;
    request.best_of = 0;
  }
  sched::RequestSpec spec;
  spec.pooling = request.pooling;
  spec.prompt_token_ids = std::move(request.prompt_token_ids);
  spec.sampling = request.sampling;
  spec.stop.max_tokens = request.max_tokens;
  spec.stop.ignore_eos = request.ignore_eos;
  spec.stop.eos_token_ids = eos_ids_;
  spec.stop.stop_token_ids = request.stop_token_ids;
  if (spec.sampling.min_tokens > 0) {
    if (spec.sampling.min_tokens > request.max_tokens) {
      return invalid_argument("min_tokens is ", spec.sampling.min_tokens,
                              ", more than max_tokens (", request.max_tokens, ")");
    }
    // What min_tokens holds back: the ids that would end the sample.
    std::vector<int32_t>& banned = spec.sampling.min_tokens_banned;
    banned = request.stop_token_ids;
    if (!request.ignore_eos) banned.insert(banned.end(), eos_ids_.begin(), eos_ids_.end());
    std::sort(banned.begin(), banned.end());
    banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
  }
  spec.n = request.n;
  spec.best_of = request.best_of;
  spec.priority = request.priority;
  spec.arrival_time = steady_seconds();
  spec.cache_salt = request.cache_salt;
  spec.speculation = request.speculation;
  if (!request.stop.empty() && config_.tokenizer == nullptr) {
    return invalid_argument("stop strings need a tokenizer; the engine has none");
  }
  const auto num_prompt_tokens = static_cast<int64_t>(spec.prompt_token_ids.size());
  std::optional<SampleText> resumed_text;
  if (request.resume) {
    ARBOR_RETURN_IF_ERROR(check_resume(request, num_prompt_tokens, max_model_len_, vocab_size_));
    spec.resumed_output_token_ids = request.resume->output_token_ids;
    if (config_.tokenizer != nullptr) {
      ARBOR_ASSIGN_OR_RETURN(resumed_text, resume_text(*config_.tokenizer, request, spec));
    }
  }
  ARBOR_RETURN_IF_ERROR(request.pooling
                            ? sched::check_input_length(num_prompt_tokens, max_model_len_)
                            : sched::check_prompt_length(num_prompt_tokens, max_model_len_));
  std::lock_guard<std::mutex> lock(mu_);
  spec.request_id = next_id_;
  const Status valid = sched::validate_request_spec(spec, vocab_size_);
  if (!valid.ok()) return valid;
  ++next_id_;
  if (request.request_id.empty()) request.request_id = str_cat("req-", spec.request_id);
  if (live_names_.contains(request.request_id)) {
    return invalid_argument("request id '", request.request_id, "' is already in use");
  }
  live_names_.insert(request.request_id);
  ++num_live_;
  idle_published_ = false;
  OutputGroupSpec group;
  group.id = spec.request_id;
  group.name = request.request_id;
  group.stream = std::make_shared<RequestStream>(request.request_id);
  group.n = request.n;
  group.best_of = request.best_of == 0 ? request.n : request.best_of;
  group.logprobs = request.sampling.logprobs.has_value();
  group.prompt_logprobs = request.sampling.prompt_logprobs.has_value();
  group.stop = std::move(request.stop);
  group.keep_special_ids = std::move(request.keep_special_ids);
  std::sort(group.keep_special_ids.begin(), group.keep_special_ids.end());
  group.num_prompt_tokens = num_prompt_tokens;
  const size_t tail = std::min(spec.prompt_token_ids.size(), SampleText::kPrimeTokens);
  group.prompt_tail.assign(spec.prompt_token_ids.end() - static_cast<std::ptrdiff_t>(tail),
                           spec.prompt_token_ids.end());
  group.arrival_time = spec.arrival_time;
  group.one_token_per_event = request.one_token_per_event;
  if (request.resume) {
    group.resumed_text = std::move(resumed_text);
    group.num_resumed_tokens = static_cast<int64_t>(request.resume->output_token_ids.size());
    group.resumed_cumulative_logprob = request.resume->cumulative_logprob;
  }
  std::shared_ptr<RequestStream> stream = group.stream;
  inbox_.adds.emplace_back(std::move(group), sched::make_request(std::move(spec)));
  cv_.notify_all();
  return stream;
}

void EngineCore::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.aborts.push_back(request_id);
  }
  cv_.notify_all();
}

void EngineCore::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return num_live_ == 0 && idle_published_; });
}

}  // namespace arbor::engine
