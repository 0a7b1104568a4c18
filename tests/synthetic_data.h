// A synthetic token dataset for training tests: documents that follow the fixed rule
// t' = (5t + 3) mod 63 from seeded starts, each ending with EOT 63 (vocab 64). A model that learns
// the rule predicts every token but the first of each document, so the loss can fall far.
#pragma once

#include <cstdint>

#include "runtime/io/token_dataset.h"

namespace berth::test {

constexpr int kRuleVocab = 64;

inline TokenDataset rule_dataset(int n_docs, int doc_len, uint32_t seed) {
  TokenDataset ds;
  ds.vocab_size = kRuleVocab;
  ds.eot_token = kRuleVocab - 1;
  ds.tokenizer = "synthetic";
  ds.doc_offsets.push_back(0);
  uint32_t state = seed;
  for (int d = 0; d < n_docs; d++) {
    state = state * 1664525u + 1013904223u;
    uint32_t t = (state >> 8) % 63;
    for (int i = 0; i < doc_len; i++) {
      ds.tokens.push_back(t);
      t = (5 * t + 3) % 63;
    }
    ds.tokens.push_back(uint32_t(ds.eot_token));
    ds.doc_offsets.push_back(ds.tokens.size());
  }
  return ds;
}

}  // namespace berth::test
