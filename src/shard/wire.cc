#include "shard/wire.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

namespace arbor::shard {

namespace {

std::string idx(const std::string& field, size_t i) { return str_cat(field, "[", i, "]"); }

}  // namespace

// "requests[3]" formatted only when an error names it (the hot path builds no string).
std::string StepDecoder::Field::operator+(const char* suffix) const {
  return str_cat(list, "[", index, "]", suffix);
}

namespace {

}  // namespace

// ---- encoder ----------------------------------------------------------------------------------

void StepEncoder::encode(const step::SchedulerOutput& output, uint64_t incarnation,
                         wire::Step* msg) {
  msg->Clear();
  msg->set_incarnation(incarnation);
  msg->set_step(++step_);
  msg->set_engine_step(output.step);
  msg->set_total_num_scheduled_tokens(output.total_num_scheduled_tokens);
  for (step::RequestId id : output.finished_ids) {
    if (known_.erase(id) > 0) msg->add_finished_ids(id);
  }
  for (step::RequestId id : output.preempted_ids) {
    if (known_.erase(id) > 0) msg->add_preempted_ids(id);
  }
  for (const step::NewRequestData& d : output.new_requests) {
    wire::NewRequest* n = msg->add_new_requests();
    n->set_request_id(d.request_id);
    n->mutable_token_ids()->Add(d.token_ids.begin(), d.token_ids.end());
    n->set_num_prompt_tokens(d.num_prompt_tokens);
    encode_sampling(d.sampling, n->mutable_sampling());
    n->set_seed(d.seed);
    n->set_pooling(d.pooling ? static_cast<int32_t>(*d.pooling) : 0);
    n->set_fork_of(d.fork_of);
    n->set_state_checkpoint(d.state_checkpoint + 1);
    known_[d.request_id] = Known{};
  }
  for (const step::ScheduledRequest& s : output.requests) {
    wire::Scheduled* m = msg->add_requests();
    m->set_request_id(s.request_id);
    m->set_num_computed_tokens(s.num_computed_tokens);
    m->set_num_scheduled_tokens(s.num_scheduled_tokens);
    m->mutable_new_token_ids()->Add(s.new_token_ids.begin(), s.new_token_ids.end());
    m->set_num_drafts(s.num_drafts);
    m->set_sample(s.sample);
    m->set_max_next_draft_tokens(s.max_next_draft_tokens);
    m->set_max_next_draft_nodes(s.max_next_draft_nodes);
    m->set_prompt_logprobs_begin(s.prompt_logprobs_begin);
    m->set_prompt_logprobs_end(s.prompt_logprobs_end);
    m->set_pool(s.pool);
    m->set_is_prompt_chunk(s.is_prompt_chunk);
    m->set_is_new(s.is_new);
    m->set_save_state_at(s.save_state_at);
    m->set_save_state_slot(s.save_state_slot);
    encode_tables(s, known_[s.request_id], m);
  }
  for (const step::BlockCopy& c : output.block_copies) {
    msg->add_block_copies(c.src_block);
    msg->add_block_copies(c.dst_block);
    msg->add_block_copies(c.num_tokens);
  }
}

// Each group's table as an edit of the one the shard holds: the leading run of released (0)
// entries, the entries kept after it, then the appended ones. No edits when nothing changed.
void StepEncoder::encode_tables(const step::ScheduledRequest& s, Known& k, wire::Scheduled* m) {
  if (k.tables == s.block_tables) return;
  k.tables.resize(s.block_tables.size());
  for (size_t g = 0; g < s.block_tables.size(); ++g) {
    const std::vector<step::BlockId>& now = s.block_tables[g];
    std::vector<step::BlockId>& old = k.tables[g];
    size_t released = 0;
    while (released < now.size() && now[released] == 0) ++released;
    size_t keep = released;
    const size_t common = std::min(old.size(), now.size());
    if (keep > common) keep = common;
    while (keep < common && old[keep] == now[keep]) ++keep;
    wire::TableEdit* e = m->add_tables();
    e->set_keep(static_cast<int32_t>(keep));
    e->set_num_released(static_cast<int32_t>(released));
    e->mutable_append()->Add(now.begin() + static_cast<std::ptrdiff_t>(keep), now.end());
    old = now;
  }
}

// ---- decoder ----------------------------------------------------------------------------------

std::vector<step::RequestId> StepDecoder::reset(uint64_t incarnation) {
  std::vector<step::RequestId> ids = known_ids();
  known_.clear();
  incarnation_ = incarnation;
  step_ = 0;
  return ids;
}

std::vector<step::RequestId> StepDecoder::known_ids() const {
  std::vector<step::RequestId> ids;
  ids.reserve(known_.size());
  for (const auto& [id, k] : known_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

WireError StepDecoder::error(const std::string& field, const std::string& message) const {
  return WireError{field, invalid_argument("step ", decoding_step_, ": ", field, ": ", message)};
}

std::optional<WireError> StepDecoder::decode(const wire::Step& msg, step::SchedulerOutput* out) {
  decoding_step_ = msg.step();
  if (msg.incarnation() != incarnation_) {
    return error("incarnation", str_cat("is ", msg.incarnation(), ", this shard runs incarnation ",
                                        incarnation_));
  }
  if (msg.step() != step_ + 1) {
    return error("step", str_cat("is ", msg.step(), ", the previous step was ", step_,
                                 " (steps are numbered 1, 2, ... per incarnation)"));
  }
  // *out is refilled in place: its vectors (and each request's token ids and block tables)
  // keep their capacity from step to step, so a decode step allocates next to nothing.
  out->step = msg.engine_step();
  out->total_num_scheduled_tokens = msg.total_num_scheduled_tokens();
  out->new_requests.clear();
  out->block_copies.clear();
  staged_.clear();
  if (auto e = check_forgets(msg, staged_)) return e;
  if (auto e = check_new(msg, out, staged_)) return e;
  int64_t total = 0;
  out->requests.resize(static_cast<size_t>(msg.requests_size()));
  for (int i = 0; i < msg.requests_size(); ++i) {
    const wire::Scheduled& m = msg.requests(i);
    const Field field{"requests", i};
    auto it = staged_.find(m.request_id());
    if (it != staged_.end() && it->second.scheduled) {
      return error(field + ".request_id", str_cat("request ", m.request_id(), " is scheduled twice"));
    }
    if (it == staged_.end()) {
      auto k = known_.find(m.request_id());
      if (k == known_.end()) {
        return error(field + ".request_id",
                     str_cat("request ", m.request_id(), " is unknown to incarnation ",
                             incarnation_));
      }
      Staged st;
      st.base = &k->second;
      st.next.num_tokens = k->second.num_tokens;
      st.next.num_prompt_tokens = k->second.num_prompt_tokens;
      st.next.pooling = k->second.pooling;
      st.tables_from_base = true;
      it = staged_.emplace(m.request_id(), std::move(st)).first;
    } else if (it->second.next.num_tokens < 0) {
      return error(field + ".request_id",
                   str_cat("request ", m.request_id(), " is forgotten by this step"));
    }
    it->second.scheduled = true;
    if (auto e = check_scheduled(m, field, it->second, &out->requests[static_cast<size_t>(i)])) {
      return e;
    }
    total += m.num_scheduled_tokens();
  }
  if (total != msg.total_num_scheduled_tokens()) {
    return error("total_num_scheduled_tokens",
                 str_cat("is ", msg.total_num_scheduled_tokens(), ", the requests schedule ",
                         total));
  }
  if (auto e = check_copies(msg, out)) return e;
  // Every check passed: commit.
  for (auto& [id, st] : staged_) {
    if (st.next.num_tokens < 0) {
      known_.erase(id);
    } else if (st.tables_from_base) {
      known_[id].num_tokens = st.next.num_tokens;  // the tables stay as they are
    } else {
      known_[id] = std::move(st.next);
    }
  }
  step_ = msg.step();
  return std::nullopt;
}

// Finished and preempted ids: known, and named once; staged as forgotten (num_tokens -1).
std::optional<WireError> StepDecoder::check_forgets(
    const wire::Step& msg, std::unordered_map<step::RequestId, Staged>& staged) {
  for (const bool finished : {true, false}) {
    const auto& ids = finished ? msg.finished_ids() : msg.preempted_ids();
    const char* name = finished ? "finished_ids" : "preempted_ids";
    for (int i = 0; i < ids.size(); ++i) {
      const step::RequestId id = ids.Get(i);
      if (staged.contains(id)) {
        return error(idx(name, static_cast<size_t>(i)), str_cat("request ", id, " is forgotten twice"));
      }
      if (!known_.contains(id)) {
        return error(idx(name, static_cast<size_t>(i)),
                     str_cat("request ", id, " is unknown to incarnation ", incarnation_));
      }
      Known forgotten;
      forgotten.num_tokens = -1;
      staged.emplace(id, Staged{nullptr, std::move(forgotten)});
    }
  }
  // The executor forgets them (step::SchedulerOutput's order: finished, then preempted).
  return std::nullopt;
}

// New requests: unknown (or forgotten by this very message), a valid prompt and parameters.
std::optional<WireError> StepDecoder::check_new(const wire::Step& msg, step::SchedulerOutput* out,
                                                std::unordered_map<step::RequestId, Staged>& staged) {
  out->finished_ids.assign(msg.finished_ids().begin(), msg.finished_ids().end());
  out->preempted_ids.assign(msg.preempted_ids().begin(), msg.preempted_ids().end());
  out->new_requests.reserve(static_cast<size_t>(msg.new_requests_size()));
  for (int i = 0; i < msg.new_requests_size(); ++i) {
    const wire::NewRequest& n = msg.new_requests(i);
    const Field field{"new_requests", i};
    auto it = staged.find(n.request_id());
    const bool forgotten_now = it != staged.end() && it->second.next.num_tokens < 0;
    if ((known_.contains(n.request_id()) && !forgotten_now) ||
        (it != staged.end() && !forgotten_now)) {
      return error(field + ".request_id",
                   str_cat("request ", n.request_id(), " is already known to incarnation ",
                           incarnation_));
    }
    const int num_tokens = n.token_ids_size();
    if (n.num_prompt_tokens() < 1 || n.num_prompt_tokens() > num_tokens) {
      return error(field + ".num_prompt_tokens",
                   str_cat("is ", n.num_prompt_tokens(), " of ", num_tokens,
                           " tokens; a prompt has 1 .. num_tokens tokens"));
    }
    for (int t = 0; t < num_tokens; ++t) {
      if (n.token_ids(t) < 0 || n.token_ids(t) >= limits_.vocab_size) {
        return error(idx(field + ".token_ids", static_cast<size_t>(t)),
                     str_cat("is ", n.token_ids(t), ", the vocabulary has ", limits_.vocab_size,
                             " tokens"));
      }
    }
    if (n.pooling() < 0 || n.pooling() > static_cast<int32_t>(step::PoolingType::kRank)) {
      return error(field + ".pooling", str_cat("is ", n.pooling(), ", not 0 (none) .. 4 (rank)"));
    }
    if (n.sampling().has_grammar() &&
        (n.sampling().grammar().kind() < 0 ||
         n.sampling().grammar().kind() > static_cast<int32_t>(grammar::GrammarKind::kChoice))) {
      return error(field + ".sampling.grammar.kind",
                   str_cat("is ", n.sampling().grammar().kind(), ", not a grammar kind"));
    }
    step::NewRequestData d;
    d.request_id = n.request_id();
    d.token_ids.assign(n.token_ids().begin(), n.token_ids().end());
    d.num_prompt_tokens = n.num_prompt_tokens();
    d.sampling = decode_sampling(n.sampling());
    if (Status st = d.sampling.validate(limits_.vocab_size); !st.ok()) {
      return error(field + ".sampling", st.message());
    }
    d.seed = n.seed();
    if (n.pooling() != 0) d.pooling = static_cast<step::PoolingType>(n.pooling());
    d.fork_of = n.fork_of();
    d.state_checkpoint = n.state_checkpoint() - 1;
    Known k;
    k.num_tokens = num_tokens;
    k.num_prompt_tokens = n.num_prompt_tokens();
    k.pooling = n.pooling() != 0;
    staged[n.request_id()] = Staged{nullptr, std::move(k)};
    out->new_requests.push_back(std::move(d));
  }
  return std::nullopt;
}

// One scheduled request's counts, token ids, flags and ranges against what the shard knows.
std::optional<WireError> StepDecoder::check_scheduled(const wire::Scheduled& m,
                                                      const Field& field, Staged& st,
                                                      step::ScheduledRequest* s) const {
  Known& k = st.next;
  for (int t = 0; t < m.new_token_ids_size(); ++t) {
    if (m.new_token_ids(t) < 0 || m.new_token_ids(t) >= limits_.vocab_size) {
      return error(idx(field + ".new_token_ids", static_cast<size_t>(t)),
                   str_cat("is ", m.new_token_ids(t), ", the vocabulary has ", limits_.vocab_size,
                           " tokens"));
    }
  }
  k.num_tokens += m.new_token_ids_size();
  if (m.num_scheduled_tokens() < 1) {
    return error(field + ".num_scheduled_tokens", str_cat("is ", m.num_scheduled_tokens(),
                                                          ", a scheduled request runs >= 1"));
  }
  if (m.num_drafts() < 0 || m.num_drafts() >= m.num_scheduled_tokens()) {
    return error(field + ".num_drafts",
                 str_cat("is ", m.num_drafts(), " of ", m.num_scheduled_tokens(),
                         " scheduled tokens; drafts follow a committed token"));
  }
  const int64_t committed_end =
      m.num_computed_tokens() + m.num_scheduled_tokens() - m.num_drafts();
  if (m.num_computed_tokens() < 0 || committed_end > k.num_tokens ||
      (m.sample() && committed_end != k.num_tokens)) {
    return error(field + ".num_computed_tokens",
                 str_cat("runs tokens [", m.num_computed_tokens(), ", ", committed_end,
                         ") of request ", m.request_id(), ", which has ", k.num_tokens,
                         m.sample() ? " (a sampling step runs up to the last one)" : ""));
  }
  if (m.pool() && !k.pooling) {
    return error(field + ".pool", str_cat("request ", m.request_id(), " is not a pooling request"));
  }
  if (m.sample() && k.pooling) {
    return error(field + ".sample", str_cat("request ", m.request_id(), " is a pooling request"));
  }
  if (m.prompt_logprobs_end() != m.prompt_logprobs_begin() &&
      (m.prompt_logprobs_begin() < m.num_computed_tokens() + 1 ||
       m.prompt_logprobs_end() < m.prompt_logprobs_begin() ||
       m.prompt_logprobs_end() > committed_end + 1 ||
       m.prompt_logprobs_end() > k.num_prompt_tokens)) {
    return error(field + ".prompt_logprobs_begin",
                 str_cat("positions [", m.prompt_logprobs_begin(), ", ", m.prompt_logprobs_end(),
                         ") are not within [", m.num_computed_tokens() + 1, ", ",
                         std::min<int64_t>(committed_end + 1, k.num_prompt_tokens), ")"));
  }
  if (m.max_next_draft_tokens() < 0 || m.max_next_draft_nodes() < 0) {
    return error(field + ".max_next_draft_tokens",
                 str_cat("draft limits ", m.max_next_draft_tokens(), " levels, ",
                         m.max_next_draft_nodes(), " nodes are negative"));
  }
  s->request_id = m.request_id();
  s->num_computed_tokens = m.num_computed_tokens();
  s->num_scheduled_tokens = m.num_scheduled_tokens();
  s->new_token_ids.assign(m.new_token_ids().begin(), m.new_token_ids().end());
  s->num_drafts = m.num_drafts();
  s->sample = m.sample();
  s->max_next_draft_tokens = m.max_next_draft_tokens();
  s->max_next_draft_nodes = m.max_next_draft_nodes();
  s->prompt_logprobs_begin = m.prompt_logprobs_begin();
  s->prompt_logprobs_end = m.prompt_logprobs_end();
  s->pool = m.pool();
  s->is_prompt_chunk = m.is_prompt_chunk();
  s->is_new = m.is_new();
  if (m.save_state_at() != 0 &&
      (m.save_state_at() <= m.num_computed_tokens() || m.save_state_at() > committed_end ||
       m.save_state_slot() < 0)) {
    return error(field + ".save_state_at",
                 str_cat("is ", m.save_state_at(), " (slot ", m.save_state_slot(), "), outside the ",
                         "tokens (", m.num_computed_tokens(), ", ", committed_end, "] this step runs"));
  }
  s->save_state_at = m.save_state_at();
  s->save_state_slot = m.save_state_slot();
  return check_tables(m, field, st, s);
}

// The table edits: within the table held, block ids in range, one length over the groups,
// covering the slots the step writes.
std::optional<WireError> StepDecoder::check_tables(const wire::Scheduled& m,
                                                   const Field& field, Staged& st,
                                                   step::ScheduledRequest* s) const {
  Known& k = st.next;
  if (m.tables_size() != 0 && m.tables_size() != limits_.num_kv_groups) {
    return error(field + ".tables", str_cat("has ", m.tables_size(), " edits, the KV cache has ",
                                            limits_.num_kv_groups, " groups"));
  }
  const bool from_base = st.tables_from_base && m.tables_size() == 0;
  if (st.tables_from_base && !from_base) {
    k.tables = st.base->tables;  // edited: this step's own copy
    st.tables_from_base = false;
  }
  const std::vector<std::vector<step::BlockId>>& tables = from_base ? st.base->tables : k.tables;
  if (m.tables_size() == 0 && tables.empty()) {
    return error(field + ".tables", str_cat("request ", m.request_id(),
                                            " has no block table yet and none is sent"));
  }
  if (!from_base) k.tables.resize(static_cast<size_t>(limits_.num_kv_groups));
  for (int g = 0; g < m.tables_size(); ++g) {
    const wire::TableEdit& e = m.tables(g);
    const std::string f = idx(field + ".tables", static_cast<size_t>(g));
    std::vector<step::BlockId>& t = k.tables[static_cast<size_t>(g)];
    if (e.keep() < 0 || static_cast<size_t>(e.keep()) > t.size()) {
      return error(f + ".keep", str_cat("is ", e.keep(), ", the table held has ", t.size(),
                                        " blocks"));
    }
    t.resize(static_cast<size_t>(e.keep()));
    for (int b = 0; b < e.append_size(); ++b) {
      if (e.append(b) < 0 || e.append(b) >= limits_.num_kv_blocks) {
        return error(idx(f + ".append", static_cast<size_t>(b)),
                     str_cat("is block ", e.append(b), ", the KV pool has blocks 0 .. ",
                             limits_.num_kv_blocks - 1));
      }
      t.push_back(e.append(b));
    }
    if (e.num_released() < 0 || static_cast<size_t>(e.num_released()) > t.size()) {
      return error(f + ".num_released", str_cat("is ", e.num_released(), ", the table has ",
                                                t.size(), " blocks"));
    }
    std::fill(t.begin(), t.begin() + e.num_released(), 0);
  }
  const size_t len = tables[0].size();
  for (size_t g = 1; g < tables.size(); ++g) {
    if (tables[g].size() != len) {
      return error(idx(field + ".tables", g), str_cat("has ", tables[g].size(),
                                                      " blocks, group 0 has ", len));
    }
  }
  const int64_t slots = static_cast<int64_t>(len) * limits_.block_size;
  const int64_t needed = m.num_computed_tokens() + m.num_scheduled_tokens();
  if (slots < needed) {
    return error(field + ".tables", str_cat("hold ", slots, " slots (", len, " blocks of ",
                                            limits_.block_size, "), the step writes up to slot ",
                                            needed));
  }
  // Position p lives in block p / block_size: every block the step writes must be usable.
  const int64_t bs = limits_.block_size;
  for (size_t g = 0; g < tables.size(); ++g) {
    for (int64_t b = m.num_computed_tokens() / bs; b <= (needed - 1) / bs; ++b) {
      if (tables[g][static_cast<size_t>(b)] == 0) {
        return error(field + str_cat(".tables[", g, "][", b, "]").c_str(),
                     str_cat("is the null block, which the step writes (positions [",
                             m.num_computed_tokens(), ", ", needed, "))"));
      }
    }
  }
  s->block_tables = tables;
  return std::nullopt;
}

std::optional<WireError> StepDecoder::check_copies(const wire::Step& msg,
                                                   step::SchedulerOutput* out) const {
  const auto& c = msg.block_copies();
  if (c.size() % 3 != 0) {
    return error("block_copies", str_cat("has ", c.size(), " entries, not (src, dst, tokens) triples"));
  }
  for (int i = 0; i < c.size(); i += 3) {
    const std::string f = idx("block_copies", static_cast<size_t>(i / 3));
    for (int j = 0; j < 2; ++j) {
      if (c.Get(i + j) < 1 || c.Get(i + j) >= limits_.num_kv_blocks) {
        return error(f, str_cat(j == 0 ? "source" : "destination", " block ", c.Get(i + j),
                                " is not a usable block (1 .. ", limits_.num_kv_blocks - 1, ")"));
      }
    }
    if (c.Get(i + 2) < 0 || c.Get(i + 2) > limits_.block_size) {
      return error(f, str_cat("copies ", c.Get(i + 2), " tokens, a block holds ",
                              limits_.block_size));
    }
    out->block_copies.push_back(
        step::BlockCopy{.src_block = c.Get(i), .dst_block = c.Get(i + 1), .num_tokens = c.Get(i + 2)});
  }
  return std::nullopt;
}

// ---- sampling parameters ----------------------------------------------------------------------

void encode_sampling(const sampling::SamplingParams& p, wire::Sampling* m) {
  m->set_temperature(p.temperature);
  m->set_top_k(p.top_k);
  m->set_top_p(p.top_p);
  m->set_min_p(p.min_p);
  m->set_repetition_penalty(p.repetition_penalty);
  m->set_presence_penalty(p.presence_penalty);
  m->set_frequency_penalty(p.frequency_penalty);
  for (const auto& [id, bias] : p.logit_bias) {
    m->add_logit_bias_ids(id);
    m->add_logit_bias_values(bias);
  }
  if (p.seed) m->set_seed(*p.seed);
  if (p.logprobs) m->set_logprobs(*p.logprobs);
  if (p.prompt_logprobs) m->set_prompt_logprobs(*p.prompt_logprobs);
  if (p.grammar) {
    wire::Grammar* g = m->mutable_grammar();
    g->set_kind(static_cast<int32_t>(p.grammar->kind));
    g->set_source(p.grammar->source);
    if (p.grammar->thinking) {
      const grammar::ThinkingSpec& t = *p.grammar->thinking;
      wire::Thinking* w = g->mutable_thinking();
      w->set_start(t.markers.start);
      w->set_end(t.markers.end);
      w->set_content_open(t.markers.content_open);
      w->set_open(t.start == grammar::ThinkingStart::kOpen);
      for (const grammar::ThinkingSpec::ControlText& c : t.control_texts) {
        w->add_control_ids(c.id);
        w->add_control_texts(c.text);
      }
    }
  }
  m->set_min_tokens(p.min_tokens);
  m->mutable_min_tokens_banned()->Add(p.min_tokens_banned.begin(), p.min_tokens_banned.end());
}

sampling::SamplingParams decode_sampling(const wire::Sampling& m) {
  sampling::SamplingParams p;
  p.temperature = m.temperature();
  p.top_k = m.top_k();
  p.top_p = m.top_p();
  p.min_p = m.min_p();
  p.repetition_penalty = m.repetition_penalty();
  p.presence_penalty = m.presence_penalty();
  p.frequency_penalty = m.frequency_penalty();
  const int n = std::min(m.logit_bias_ids_size(), m.logit_bias_values_size());
  for (int i = 0; i < n; ++i) p.logit_bias.emplace_back(m.logit_bias_ids(i), m.logit_bias_values(i));
  if (m.has_seed()) p.seed = m.seed();
  if (m.has_logprobs()) p.logprobs = m.logprobs();
  if (m.has_prompt_logprobs()) p.prompt_logprobs = m.prompt_logprobs();
  if (m.has_grammar()) {
    grammar::GrammarSpec g;
    g.kind = static_cast<grammar::GrammarKind>(m.grammar().kind());
    g.source = m.grammar().source();
    if (m.grammar().has_thinking()) {
      const wire::Thinking& w = m.grammar().thinking();
      grammar::ThinkingSpec t;
      t.markers.start = w.start();
      t.markers.end = w.end();
      t.markers.content_open = w.content_open();
      t.start = w.open() ? grammar::ThinkingStart::kOpen : grammar::ThinkingStart::kMaybe;
      const int c = std::min(w.control_ids_size(), w.control_texts_size());
      for (int i = 0; i < c; ++i) t.control_texts.push_back({w.control_ids(i), w.control_texts(i)});
      g.thinking = std::move(t);
    }
    p.grammar = std::move(g);
  }
  p.min_tokens = m.min_tokens();
  p.min_tokens_banned.assign(m.min_tokens_banned().begin(), m.min_tokens_banned().end());
  return p;
}

// ---- results ----------------------------------------------------------------------------------

void encode_result(const step::StepResult& result, wire::StepReply* m) {
  m->set_experts_touched(result.experts_touched);
  m->set_propose_seconds(result.propose_seconds);
  for (const step::RequestResult& r : result.requests) {
    wire::RequestResult* w = m->add_requests();
    w->set_request_id(r.request_id);
    if (!r.error.ok()) {
      w->set_error(r.error.message());
      w->set_error_code(static_cast<int32_t>(r.error.code()));
    }
    for (const step::SampledToken& t : r.tokens) {
      wire::Token* wt = w->add_tokens();
      wt->set_token_id(t.token_id);
      wt->set_logprob(t.logprob);
      for (const sampling::TokenLogprob& top : t.top_logprobs) {
        wt->add_top_ids(top.token_id);
        wt->add_top_logprobs(top.logprob);
      }
    }
    w->set_num_draft_tokens(r.num_draft_tokens);
    w->set_num_accepted(r.num_accepted);
    w->mutable_accepted_draft_indices()->Add(r.accepted_draft_indices.begin(),
                                             r.accepted_draft_indices.end());
    w->mutable_next_draft_parents()->Add(r.next_drafts.parent_ids.begin(),
                                         r.next_drafts.parent_ids.end());
    w->mutable_next_draft_probs()->Add(r.next_drafts.probs.begin(), r.next_drafts.probs.end());
    w->set_unverified_first_draft_agreed_plus_1(r.unverified_first_draft_agreed + 1);
  }
  for (const step::PromptLogprobsResult& p : result.prompt_logprobs) {
    wire::PromptLogprobs* w = m->add_prompt_logprobs();
    w->set_request_id(p.request_id);
    w->set_first_position(p.first_position);
    for (const sampling::PromptLogprob& e : p.entries) {
      w->add_token_ids(e.token_id);
      w->add_logprobs(e.logprob);
      w->add_ranks(e.rank);
      w->add_num_top(static_cast<int32_t>(e.top.size()));
      for (const sampling::TokenLogprob& t : e.top) {
        w->add_top_ids(t.token_id);
        w->add_top_logprobs(t.logprob);
      }
    }
  }
  for (const step::PoolingResult& p : result.pooled) {
    wire::Pooled* w = m->add_pooled();
    w->set_request_id(p.request_id);
    if (!p.error.ok()) {
      w->set_error(p.error.message());
      w->set_error_code(static_cast<int32_t>(p.error.code()));
    }
    w->mutable_values()->Add(p.values.begin(), p.values.end());
  }
}

namespace {

// *out = the request's error (ok when the message is empty); an error when the code is unknown.
Status decode_error(const std::string& message, int32_t code, step::RequestId id, Status* out) {
  *out = ok_status();
  if (message.empty()) return ok_status();
  if (code <= 0 || code > static_cast<int32_t>(StatusCode::kInternal)) {
    return invalid_argument("request ", id, ": error code ", code, " is not a status code");
  }
  *out = Status(static_cast<StatusCode>(code), message);
  return ok_status();
}

Result<step::PromptLogprobsResult> decode_prompt_logprobs(const wire::PromptLogprobs& w) {
  const int n = w.token_ids_size();
  if (w.logprobs_size() != n || w.ranks_size() != n || w.num_top_size() != n ||
      w.top_ids_size() != w.top_logprobs_size()) {
    return invalid_argument("request ", w.request_id(), ": prompt logprobs arrays of ", n, ", ",
                            w.logprobs_size(), ", ", w.ranks_size(), ", ", w.num_top_size(),
                            " entries and ", w.top_ids_size(), " / ", w.top_logprobs_size(),
                            " alternatives");
  }
  step::PromptLogprobsResult p;
  p.request_id = w.request_id();
  p.first_position = w.first_position();
  p.entries.resize(static_cast<size_t>(n));
  int next = 0;
  for (int i = 0; i < n; ++i) {
    sampling::PromptLogprob& e = p.entries[static_cast<size_t>(i)];
    e.token_id = w.token_ids(i);
    e.logprob = w.logprobs(i);
    e.rank = w.ranks(i);
    if (w.num_top(i) < 0 || next + w.num_top(i) > w.top_ids_size()) {
      return invalid_argument("request ", w.request_id(), ": prompt position ", i,
                              " names more alternatives than were sent");
    }
    for (int j = 0; j < w.num_top(i); ++j, ++next) {
      e.top.push_back({w.top_ids(next), w.top_logprobs(next)});
    }
  }
  if (next != w.top_ids_size()) {
    return invalid_argument("request ", w.request_id(), ": ", w.top_ids_size() - next,
                            " prompt logprob alternatives belong to no position");
  }
  return p;
}

}  // namespace

Result<step::StepResult> decode_result(const wire::StepReply& m) {
  step::StepResult result;
  result.experts_touched = m.experts_touched();
  result.propose_seconds = m.propose_seconds();
  result.requests.reserve(static_cast<size_t>(m.requests_size()));
  for (const wire::RequestResult& w : m.requests()) {
    step::RequestResult r;
    r.request_id = w.request_id();
    ARBOR_RETURN_IF_ERROR(decode_error(w.error(), w.error_code(), w.request_id(), &r.error));
    r.tokens.resize(static_cast<size_t>(w.tokens_size()));
    for (int i = 0; i < w.tokens_size(); ++i) {
      const wire::Token& wt = w.tokens(i);
      step::SampledToken& t = r.tokens[static_cast<size_t>(i)];
      if (wt.top_ids_size() != wt.top_logprobs_size()) {
        return invalid_argument("request ", w.request_id(), ": token ", i, " has ",
                                wt.top_ids_size(), " top ids and ", wt.top_logprobs_size(),
                                " top logprobs");
      }
      t.token_id = wt.token_id();
      t.logprob = wt.logprob();
      for (int j = 0; j < wt.top_ids_size(); ++j) {
        t.top_logprobs.push_back({wt.top_ids(j), wt.top_logprobs(j)});
      }
    }
    r.num_draft_tokens = w.num_draft_tokens();
    r.num_accepted = w.num_accepted();
    r.accepted_draft_indices.assign(w.accepted_draft_indices().begin(),
                                    w.accepted_draft_indices().end());
    r.next_drafts.parent_ids.assign(w.next_draft_parents().begin(), w.next_draft_parents().end());
    r.next_drafts.probs.assign(w.next_draft_probs().begin(), w.next_draft_probs().end());
    if (w.unverified_first_draft_agreed_plus_1() < 0 ||
        w.unverified_first_draft_agreed_plus_1() > 2) {
      return invalid_argument("request ", w.request_id(), ": unverified_first_draft_agreed_plus_1 ",
                              w.unverified_first_draft_agreed_plus_1(), " is not 0, 1 or 2");
    }
    r.unverified_first_draft_agreed = w.unverified_first_draft_agreed_plus_1() - 1;
    result.requests.push_back(std::move(r));
  }
  for (const wire::PromptLogprobs& w : m.prompt_logprobs()) {
    ARBOR_ASSIGN_OR_RETURN(step::PromptLogprobsResult p, decode_prompt_logprobs(w));
    result.prompt_logprobs.push_back(std::move(p));
  }
  for (const wire::Pooled& w : m.pooled()) {
    step::PoolingResult p;
    p.request_id = w.request_id();
    ARBOR_RETURN_IF_ERROR(decode_error(w.error(), w.error_code(), w.request_id(), &p.error));
    p.values.assign(w.values().begin(), w.values().end());
    result.pooled.push_back(std::move(p));
  }
  return result;
}

}  // namespace arbor::shard
