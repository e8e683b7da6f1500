#include "router/wire.h"

#include "shard/wire.h"

namespace arbor::router {
namespace {

void encode_top(const std::vector<sampling::TokenLogprob>& top,
                google::protobuf::RepeatedPtrField<wire::TokenLogprob>* m) {
  for (const sampling::TokenLogprob& t : top) {
    wire::TokenLogprob* w = m->Add();
    w->set_token_id(t.token_id);
    w->set_logprob(t.logprob);
  }
}

std::vector<sampling::TokenLogprob> decode_top(
    const google::protobuf::RepeatedPtrField<wire::TokenLogprob>& m) {
  std::vector<sampling::TokenLogprob> top;
  top.reserve(static_cast<size_t>(m.size()));
  for (const wire::TokenLogprob& w : m) top.push_back({w.token_id(), w.logprob()});
  return top;
}

}  // namespace

void encode_request(const engine::GenerateRequest& r, wire::GenerateCall* m) {
  m->set_protocol_version(kReplicaProtocolVersion);
  m->set_request_id(r.request_id);
  m->mutable_prompt_token_ids()->Assign(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
  shard::encode_sampling(r.sampling, m->mutable_sampling());
  m->set_max_tokens(r.max_tokens);
  m->set_ignore_eos(r.ignore_eos);
  m->mutable_stop_token_ids()->Assign(r.stop_token_ids.begin(), r.stop_token_ids.end());
  for (const std::string& s : r.stop) m->add_stop(s);
  m->mutable_keep_special_ids()->Assign(r.keep_special_ids.begin(), r.keep_special_ids.end());
  m->set_n(r.n);
  m->set_best_of(r.best_of);
  m->set_priority(r.priority);
  m->set_cache_salt(r.cache_salt);
  m->mutable_speculation()->set_mode(static_cast<int32_t>(r.speculation.mode));
  m->mutable_speculation()->set_k(r.speculation.k);
  m->mutable_speculation()->set_tree_nodes(r.speculation.tree_nodes);
  m->set_pooling(r.pooling ? static_cast<int32_t>(*r.pooling) : 0);
  m->set_one_token_per_event(r.one_token_per_event);
  m->set_session(r.session);
  if (r.resume) {
    wire::Resume* w = m->mutable_resume();
    w->mutable_output_token_ids()->Assign(r.resume->output_token_ids.begin(),
                                          r.resume->output_token_ids.end());
    w->set_text_bytes(r.resume->text_bytes);
    w->set_cumulative_logprob(r.resume->cumulative_logprob);
  }
}

Result<engine::GenerateRequest> decode_request(const wire::GenerateCall& m) {
  engine::GenerateRequest r;
  r.request_id = m.request_id();
  r.prompt_token_ids.assign(m.prompt_token_ids().begin(), m.prompt_token_ids().end());
  r.sampling = shard::decode_sampling(m.sampling());
  r.max_tokens = m.max_tokens();
  r.ignore_eos = m.ignore_eos();
  r.stop_token_ids.assign(m.stop_token_ids().begin(), m.stop_token_ids().end());
  r.stop.assign(m.stop().begin(), m.stop().end());
  r.keep_special_ids.assign(m.keep_special_ids().begin(), m.keep_special_ids().end());
  r.n = m.n();
  r.best_of = m.best_of();
  r.priority = m.priority();
  r.cache_salt = m.cache_salt();
  const int32_t mode = m.speculation().mode();
  if (mode < 0 || mode > static_cast<int32_t>(sched::SpecMode::kFixed)) {
    return invalid_argument("GenerateCall.speculation.mode is ", mode, ", must be in [0, 2]");
  }
  r.speculation.mode = static_cast<sched::SpecMode>(mode);
  r.speculation.k = m.speculation().k();
  r.speculation.tree_nodes = m.speculation().tree_nodes();
  if (m.pooling() != 0) {
    if (m.pooling() < static_cast<int32_t>(step::PoolingType::kMean) ||
        m.pooling() > static_cast<int32_t>(step::PoolingType::kRank)) {
      return invalid_argument("GenerateCall.pooling is ", m.pooling(), ", must be in [0, 4]");
    }
    r.pooling = static_cast<step::PoolingType>(m.pooling());
  }
  r.one_token_per_event = m.one_token_per_event();
  r.session = m.session();
  if (m.has_resume()) {
    engine::ResumeFrom resume;
    resume.output_token_ids.assign(m.resume().output_token_ids().begin(),
                                   m.resume().output_token_ids().end());
    resume.text_bytes = m.resume().text_bytes();
    resume.cumulative_logprob = m.resume().cumulative_logprob();
    r.resume = std::move(resume);
  }
  return r;
}

void encode_event(const engine::StreamEvent& e, wire::GenerateEvent* m) {
  m->set_index(e.index);
  m->mutable_token_ids()->Assign(e.token_ids.begin(), e.token_ids.end());
  m->set_text(e.text);
  for (const engine::TokenLogprobs& l : e.logprobs) {
    wire::TokenLogprobs* w = m->add_logprobs();
    w->set_token_id(l.token_id);
    w->set_logprob(l.logprob);
    encode_top(l.top, w->mutable_top());
  }
  m->set_cumulative_logprob(e.cumulative_logprob);
  if (e.prompt_logprobs != nullptr) {
    m->set_has_prompt_logprobs(true);
    for (const sampling::PromptLogprob& p : *e.prompt_logprobs) {
      wire::PromptLogprob* w = m->add_prompt_logprobs();
      w->set_token_id(p.token_id);
      w->set_logprob(p.logprob);
      w->set_rank(p.rank);
      encode_top(p.top, w->mutable_top());
    }
  }
  m->mutable_pooled()->Assign(e.pooled.begin(), e.pooled.end());
  if (e.stop_reason) {
    wire::StopReason* w = m->mutable_stop_reason();
    w->set_kind(static_cast<int32_t>(e.stop_reason->kind));
    w->set_token_id(e.stop_reason->token_id);
    w->set_stop_string(e.stop_reason->stop_string);
  }
  m->set_final(e.final);
  wire::Usage* u = m->mutable_usage();
  u->set_prompt_tokens(e.usage.prompt_tokens);
  u->set_completion_tokens(e.usage.completion_tokens);
  u->set_cached_tokens(e.usage.cached_tokens);
  u->set_draft_tokens(e.usage.draft_tokens);
  u->set_accepted_draft_tokens(e.usage.accepted_draft_tokens);
  m->set_error_code(static_cast<int32_t>(e.error.code()));
  m->set_error_message(e.error.message());
}

Result<engine::StreamEvent> decode_event(const wire::GenerateEvent& m) {
  engine::StreamEvent e;
  e.index = m.index();
  e.token_ids.assign(m.token_ids().begin(), m.token_ids().end());
  e.text = m.text();
  if (m.logprobs_size() != 0 && m.logprobs_size() != m.token_ids_size()) {
    return invalid_argument("GenerateEvent has ", m.logprobs_size(), " logprobs for ",
                            m.token_ids_size(), " tokens");
  }
  for (const wire::TokenLogprobs& w : m.logprobs()) {
    e.logprobs.push_back({w.token_id(), w.logprob(), decode_top(w.top())});
  }
  e.cumulative_logprob = m.cumulative_logprob();
  if (m.has_prompt_logprobs()) {
    auto p = std::make_shared<engine::PromptLogprobs>();
    for (const wire::PromptLogprob& w : m.prompt_logprobs()) {
      p->push_back({w.token_id(), w.logprob(), w.rank(), decode_top(w.top())});
    }
    e.prompt_logprobs = std::move(p);
  }
  e.pooled.assign(m.pooled().begin(), m.pooled().end());
  if (m.has_stop_reason()) {
    const int32_t kind = m.stop_reason().kind();
    if (kind < 0 || kind > static_cast<int32_t>(sched::StopKind::kAbort)) {
      return invalid_argument("GenerateEvent.stop_reason.kind is ", kind, ", must be in [0, 5]");
    }
    e.stop_reason = sched::StopReason{.kind = static_cast<sched::StopKind>(kind),
                                      .token_id = m.stop_reason().token_id(),
                                      .stop_string = m.stop_reason().stop_string()};
  }
  e.final = m.final();
  e.usage = engine::Usage{.prompt_tokens = m.usage().prompt_tokens(),
                          .completion_tokens = m.usage().completion_tokens(),
                          .cached_tokens = m.usage().cached_tokens(),
                          .draft_tokens = m.usage().draft_tokens(),
                          .accepted_draft_tokens = m.usage().accepted_draft_tokens()};
  if (m.error_code() < 0 || m.error_code() > static_cast<int32_t>(StatusCode::kInternal)) {
    return invalid_argument("GenerateEvent.error_code is ", m.error_code());
  }
  if (m.error_code() != 0) {
    e.error = Status(static_cast<StatusCode>(m.error_code()), m.error_message());
  }
  return e;
}

void encode_kv_events(std::span<const kv::KvEvent> events, wire::KvEventBatch* m) {
  for (const kv::KvEvent& e : events) {
    m->add_low(e.hash.low);
    m->add_high(e.hash.high);
    m->add_stored(e.stored);
  }
}

Result<std::vector<kv::KvEvent>> decode_kv_events(const wire::KvEventBatch& m) {
  if (m.low_size() != m.high_size() || m.low_size() != m.stored_size()) {
    return invalid_argument("KvEventBatch has ", m.low_size(), " low, ", m.high_size(),
                            " high and ", m.stored_size(), " stored entries");
  }
  std::vector<kv::KvEvent> events(static_cast<size_t>(m.low_size()));
  for (int i = 0; i < m.low_size(); ++i) {
    events[static_cast<size_t>(i)] =
        kv::KvEvent{.hash = kv::BlockHash{m.low(i), m.high(i)}, .stored = m.stored(i)};
  }
  return events;
}

}  // namespace arbor::router
