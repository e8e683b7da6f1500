#include "tokenizer/models.h"

#include <algorithm>
#include <queue>
#include <string>

#include "tokenizer/utf8.h"

namespace arbor::tokenizer::internal {

namespace {

struct SpmSymbol {
  int32_t prev;
  int32_t next;
  uint32_t offset;  // into the text
  uint32_t n;       // bytes; 0 once merged into its left neighbour
};

struct SpmBigram {
  int32_t left;
  int32_t right;
  float score;
  uint32_t size;
};

// Highest score first; among equal scores the leftmost pair (llama.cpp's comparator).
struct SpmLess {
  bool operator()(const SpmBigram& l, const SpmBigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

void emit_bytes(const Vocab& vocab, std::string_view bytes, std::vector<int32_t>& out) {
  for (char c : bytes) {
    const int32_t id = vocab.byte_tokens[static_cast<uint8_t>(c)];
    if (id >= 0) {
      out.push_back(id);
    } else if (vocab.unk_id >= 0) {
      out.push_back(vocab.unk_id);
    }
  }
}

}  // namespace

namespace {

void spm_encode_run(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out) {
  std::vector<SpmSymbol> symbols;
  symbols.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    const size_t len = std::min(utf8_seq_len(static_cast<uint8_t>(text[offs])), text.size() - offs);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, offs + len == text.size() ? -1 : index + 1,
                       static_cast<uint32_t>(offs), static_cast<uint32_t>(len)});
    offs += len;
  }
  std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmLess> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].n + symbols[right].n;
    const int32_t id = vocab.find(text.substr(symbols[left].offset, size));
    if (id >= 0) queue.push({left, right, vocab.scores[id], size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const SpmBigram b = queue.top();
    queue.pop();
    SpmSymbol& l = symbols[b.left];
    SpmSymbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].offset, symbols[i].n);
    const int32_t id = vocab.find(piece);
    if (id >= 0) {
      out.push_back(id);
    } else {
      emit_bytes(vocab, piece, out);
    }
  }
}

}  // namespace

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out) {
  // Invalid UTF-8 can glue a stray lead byte to a "▁" in one symbol; keep llama.cpp's exact
  // behaviour for it by not cutting.
  if (!vocab.spm_independent_words || !is_valid_utf8(text)) {
    spm_encode_run(vocab, text, out);
    return;
  }
  // Cut before every "▁" that follows another character (see Vocab::spm_independent_words).
  size_t begin = 0;
  for (size_t pos = text.find(kSpaceMarker, 1); pos != std::string_view::npos;
       pos = text.find(kSpaceMarker, pos + kSpaceMarker.size())) {
    const bool after_marker = pos >= kSpaceMarker.size() &&
        text.compare(pos - kSpaceMarker.size(), kSpaceMarker.size(), kSpaceMarker) == 0;
    if (after_marker || pos == begin) continue;
    spm_encode_run(vocab, text.substr(begin, pos - begin), out);
    begin = pos;
  }
  spm_encode_run(vocab, text.substr(begin), out);
}

void BpeEncoder::add_symbol(int32_t id) {
  const auto index = static_cast<int32_t>(symbols_.size());
  symbols_.push_back({id, index - 1, -1});
  if (index > 0) symbols_[index - 1].next = index;
}

void BpeEncoder::initial_symbols(std::string_view word) {
  symbols_.clear();
  if (vocab_.byte_level) {
    for (char c : word) add_symbol(vocab_.byte_tokens[static_cast<uint8_t>(c)]);
    return;
  }
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = std::min(utf8_seq_len(static_cast<uint8_t>(word[pos])), word.size() - pos);
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    const int32_t id = vocab_.find(ch);
    if (id >= 0) {
      add_symbol(id);
      continue;
    }
    const bool all_bytes = vocab_.byte_fallback &&
        std::all_of(ch.begin(), ch.end(),
                    [&](char c) { return vocab_.byte_tokens[static_cast<uint8_t>(c)] >= 0; });
    if (all_bytes) {
      for (char c : ch) add_symbol(vocab_.byte_tokens[static_cast<uint8_t>(c)]);
    } else if (symbols_.empty() || symbols_.back().id != vocab_.unk_id) {
      add_symbol(vocab_.unk_id);  // consecutive unknowns fuse into one (fuse_unk)
    }
  }
}

namespace {
// Lowest rank first; among equal ranks the leftmost pair.
bool candidate_after(const auto& a, const auto& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}
}  // namespace

void BpeEncoder::push_candidate(int32_t left, int32_t right) {
  if (left < 0 || right < 0) return;
  const int32_t l = symbols_[left].id, r = symbols_[right].id;
  if (l < 0 || r < 0) return;
  const uint64_t key = (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r);
  const auto it = vocab_.merge_table.find(key);
  if (it == vocab_.merge_table.end()) return;
  heap_.push_back({it->second.rank, left, right, l, r, it->second.id});
  std::push_heap(heap_.begin(), heap_.end(),
                 [](const Candidate& a, const Candidate& b) { return candidate_after(a, b); });
}

void BpeEncoder::merge_all() {
  heap_.clear();
  for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) push_candidate(i - 1, i);
  auto after = [](const Candidate& a, const Candidate& b) { return candidate_after(a, b); };
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), after);
    const Candidate c = heap_.back();
    heap_.pop_back();
    Symbol& l = symbols_[c.left];
    Symbol& r = symbols_[c.right];
    // Stale when either side was merged since (ids only grow into longer tokens).
    if (l.next != c.right || l.id != c.left_id || r.id != c.right_id) continue;
    l.id = c.result;
    l.next = r.next;
    r.id = -1;
    r.next = -1;
    if (l.next >= 0) symbols_[l.next].prev = c.left;
    push_candidate(l.prev, c.left);
    push_candidate(c.left, l.next);
  }
}

void BpeEncoder::encode_word(std::string_view word, std::vector<int32_t>& out) {
  if (word.empty()) return;
  if (vocab_.ignore_merges) {
    int32_t id;
    if (vocab_.byte_level) {
      scratch_.clear();
      const auto& t = byte_level_tables();
      for (char c : word) scratch_ += t.byte_to_utf8[static_cast<uint8_t>(c)];
      id = vocab_.find(scratch_);
    } else {
      id = vocab_.find(word);
    }
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  initial_symbols(word);
  if (symbols_.size() > 1) merge_all();
  for (int32_t i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) {
    const int32_t id = symbols_[i].id;
    if (id >= 0) {
      out.push_back(id);
    } else if (vocab_.unk_id >= 0) {
      out.push_back(vocab_.unk_id);
    }
  }
}

}  // namespace arbor::tokenizer::internal
