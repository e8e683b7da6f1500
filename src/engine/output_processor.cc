#include "engine/output_processor.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "base/clock.h"

namespace arbor::engine {

OutputProcessor::OutputProcessor(const tokenizer::Tokenizer* tokenizer,
                                 EngineMetricsSnapshot& metrics,
                                 std::function<void(const std::string&)> on_final)
    : tokenizer_(tokenizer), metrics_(metrics), on_final_(std::move(on_final)) {}

void OutputProcessor::add(const OutputGroupSpec& spec) {
  Group g;
  g.spec = spec;
  g.streaming = spec.best_of == spec.n;
  g.samples.resize(static_cast<size_t>(spec.best_of));
  if (tokenizer_ != nullptr) {
    for (Sample& s : g.samples) s.text.emplace(*tokenizer_, spec.prompt_tail, spec.stop, spec.keep_special_ids);
  }
  if (spec.num_resumed_tokens > 0) {
    Sample& s = g.samples.at(0);
    if (spec.resumed_text) s.text = spec.resumed_text;
    s.num_tokens = spec.num_resumed_tokens;
    s.cumulative_logprob = spec.resumed_cumulative_logprob;
    g.got_token = true;  // the time to first token was the first engine's
  }
  ids_by_name_[spec.name] = spec.id;
  groups_.emplace(spec.id, std::move(g));
}

std::optional<sched::RequestId> OutputProcessor::find(const std::string& name) const {
  auto it = ids_by_name_.find(name);
  if (it == ids_by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<sched::RequestId> OutputProcessor::ids() const {
  std::vector<sched::RequestId> ids;
  for (const auto& [id, g] : groups_) ids.push_back(id);
  return ids;
}

std::string_view OutputProcessor::name(sched::RequestId id) const {
  auto it = groups_.find(id);
  return it == groups_.end() ? std::string_view() : std::string_view(it->second.spec.name);
}

void OutputProcessor::fail(sched::RequestId id, Status error) {
  finish_group(id, std::move(error));
}

void OutputProcessor::abort(sched::RequestId id) {
  Group& g = groups_.at(id);
  for (size_t i = 0; i < g.samples.size(); ++i) {
    if (g.samples[i].stop) continue;
    StreamEvent ev;
    ev.index = static_cast<int32_t>(i);
    finish_sample(g, static_cast<int32_t>(i), sched::StopReason{.kind = sched::StopKind::kAbort},
                  std::move(ev));
  }
  finish_group(id, ok_status());
}

std::optional<sched::StopReason> OutputProcessor::process(const sched::RequestOutput& o,
                                                          double now) {
  const sched::RequestId gid = o.parent_id != 0 ? o.parent_id : o.request_id;
  auto it = groups_.find(gid);
  if (it == groups_.end()) return std::nullopt;
  Group& g = it->second;
  if (o.first_scheduled && !g.scheduled) {
    g.scheduled = true;
    g.num_cached_tokens = o.num_cached_tokens;
    metrics_.queue_time_s.observe(now - g.spec.arrival_time);
    metrics_.num_prompt_tokens += g.spec.num_prompt_tokens;
  }
  g.num_draft_tokens += o.num_draft_tokens;
  g.num_accepted_draft_tokens += o.num_accepted_tokens;
  add_prompt_logprobs(g, o);
  if (o.new_tokens.empty() && !o.stop_reason) return std::nullopt;
  Sample& s = g.samples[static_cast<size_t>(o.sample_index)];
  StreamEvent ev;
  ev.index = o.sample_index;
  ev.pooled = o.pooled;
  attach_prompt_logprobs(g, s, ev);
  // As vLLM: the text of the token that ends the sample (EOS, a stop id) is not output.
  const bool last_is_stop_token =
      o.stop_reason && (o.stop_reason->kind == sched::StopKind::kEos ||
                        o.stop_reason->kind == sched::StopKind::kStopToken);
  std::optional<sched::StopReason> stop_string;
  for (size_t i = 0; i < o.new_tokens.size() && !stop_string; ++i) {
    const bool text = !(last_is_stop_token && i + 1 == o.new_tokens.size());
    add_token(g, s, o.new_tokens[i], text, now, ev, stop_string);
    if (g.spec.one_token_per_event && g.streaming && !stop_string &&
        i + 1 < o.new_tokens.size()) {
      g.spec.stream->push(std::exchange(ev, StreamEvent{.index = o.sample_index}));
    }
  }
  std::optional<sched::StopReason> reason = o.stop_reason;
  std::optional<sched::StopReason> to_scheduler;
  if (stop_string) {
    // The scheduler has not seen it, unless a later token of this output also ended the sample
    // there (its tokens past the stop string are then dropped, as they are from the text).
    if (!reason) to_scheduler = stop_string;
    reason = stop_string;
  }
  if (reason) {
    finish_sample(g, o.sample_index, *reason, std::move(ev));
  } else if (g.streaming) {
    g.spec.stream->push(std::move(ev));
  } else {
    buffer(s, std::move(ev));
  }
  if (g.num_finished == static_cast<int32_t>(g.samples.size())) finish_group(gid, ok_status());
  return to_scheduler;
}

// The scheduler sends each position once, in order (a fork parent's, then nothing from its
// children); CHECKed, since a gap would shift every later position.
void OutputProcessor::add_prompt_logprobs(Group& g, const sched::RequestOutput& o) {
  if (o.prompt_logprobs.empty()) return;
  ARBOR_CHECK_EQ(o.first_prompt_logprob, static_cast<int64_t>(g.prompt_logprobs.size()) + 1)
      << "prompt logprobs of request " << o.request_id << " out of order";
  g.prompt_logprobs.insert(g.prompt_logprobs.end(), o.prompt_logprobs.begin(),
                           o.prompt_logprobs.end());
}

void OutputProcessor::attach_prompt_logprobs(Group& g, Sample& s, StreamEvent& ev) {
  if (!g.spec.prompt_logprobs || s.sent_prompt_logprobs) return;
  s.sent_prompt_logprobs = true;
  if (g.prompt_logprobs_done == nullptr) {
    ARBOR_CHECK_EQ(static_cast<int64_t>(g.prompt_logprobs.size()), g.spec.num_prompt_tokens - 1)
        << "request " << g.spec.id << " emits before its prompt is scored";
    g.prompt_logprobs_done = std::make_shared<const PromptLogprobs>(std::move(g.prompt_logprobs));
  }
  ev.prompt_logprobs = g.prompt_logprobs_done;
}

void OutputProcessor::add_token(Group& g, Sample& s, const sched::SampledToken& t, bool text,
                                double now, StreamEvent& ev,
                                std::optional<sched::StopReason>& stop_string) {
  if (!g.got_token) {
    g.got_token = true;
    metrics_.ttft_s.observe(now - g.spec.arrival_time);
  } else if (s.last_token_time > 0.0) {
    metrics_.inter_token_s.observe(now - s.last_token_time);
  }
  s.last_token_time = now;
  ++metrics_.num_generation_tokens;
  ++s.num_tokens;
  ev.token_ids.push_back(t.token_id);
  s.cumulative_logprob += t.logprob;
  ev.cumulative_logprob = s.cumulative_logprob;
  if (g.spec.logprobs) {
    ev.logprobs.push_back(
        TokenLogprobs{.token_id = t.token_id, .logprob = t.logprob, .top = t.top_logprobs});
  }
  if (s.text && text) {
    SampleText::Delta d = s.text->add(t.token_id);
    ev.text += d.text;
    if (d.stopped) {
      stop_string = sched::StopReason{.kind = sched::StopKind::kStopString,
                                      .stop_string = std::move(d.stop_string)};
    }
  }
}

void OutputProcessor::finish_sample(Group& g, int32_t index, sched::StopReason reason,
                                    StreamEvent ev) {
  Sample& s = g.samples[static_cast<size_t>(index)];
  if (s.text && reason.kind != sched::StopKind::kStopString) ev.text += s.text->finish();
  ev.cumulative_logprob = s.cumulative_logprob;
  ev.stop_reason = reason;
  s.stop = std::move(reason);
  ++g.num_finished;
  if (g.streaming) {
    g.spec.stream->push(std::move(ev));
    return;
  }
  buffer(s, std::move(ev));
}

// best_of > n: the whole sample is kept until the group is done.
void OutputProcessor::buffer(Sample& s, StreamEvent ev) {
  s.token_ids.insert(s.token_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
  s.full_text += ev.text;
  for (TokenLogprobs& lp : ev.logprobs) s.logprobs.push_back(std::move(lp));
  if (ev.prompt_logprobs != nullptr) s.prompt_logprobs = std::move(ev.prompt_logprobs);
}

// Sends the best_of > n selection (if any) and the final event, then forgets the group.
void OutputProcessor::finish_group(sched::RequestId id, Status error) {
  auto it = groups_.find(id);
  ARBOR_CHECK(it != groups_.end()) << "no output group " << id;
  Group g = std::move(it->second);
  groups_.erase(it);
  ids_by_name_.erase(g.spec.name);
  StreamEvent final_ev;
  final_ev.final = true;
  final_ev.error = std::move(error);
  final_ev.usage.prompt_tokens = g.spec.num_prompt_tokens;
  final_ev.usage.cached_tokens = g.num_cached_tokens;
  final_ev.usage.draft_tokens = g.num_draft_tokens;
  final_ev.usage.accepted_draft_tokens = g.num_accepted_draft_tokens;
  for (const Sample& s : g.samples) final_ev.usage.completion_tokens += s.num_tokens;
  if (!g.streaming && final_ev.error.ok()) {
    std::vector<int32_t> order(g.samples.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return g.samples[a].cumulative_logprob > g.samples[b].cumulative_logprob;
    });
    for (int32_t k = 0; k < g.spec.n; ++k) {
      Sample& s = g.samples[order[k]];
      StreamEvent ev;
      ev.index = k;
      ev.token_ids = std::move(s.token_ids);
      ev.text = std::move(s.full_text);
      ev.logprobs = std::move(s.logprobs);
      ev.cumulative_logprob = s.cumulative_logprob;
      ev.prompt_logprobs = std::move(s.prompt_logprobs);
      ev.stop_reason = s.stop;
      g.spec.stream->push(std::move(ev));
    }
  }
  if (g.scheduled || !g.samples.empty()) {
    metrics_.e2e_s.observe(steady_seconds() - g.spec.arrival_time);
    ++metrics_.num_requests_finished;
  }
  g.spec.stream->push(std::move(final_ev));
  on_final_(g.spec.name);
}

}  // namespace arbor::engine
