// The model's shard metadata (pure): every layout's tensors, taken from every rank where they are
// unique, cover the whole model exactly once; slicing and placing are inverse; the tied LM head
// appears on the last stage; vocabulary padding to 128·tp; repadding keeps the real rows.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/model/gpt_config.h"

namespace berth {
namespace {

TEST(ModelShard, UniqueTensorsOfAllRanksCoverTheModelOnce) {
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 3, 4}) {
      const GPTConfig g = make_gpt_config(4, 4, 32, 300, 16, 128 * tp);
      EXPECT_EQ(g.Vp % (128 * tp), 0);
      const ParamLayout whole = gpt_param_layout(g);
      std::vector<float> full(size_t(whole.total));
      std::iota(full.begin(), full.end(), 0.f);  // every element its own index
      std::vector<int> hits(full.size(), 0);
      int64_t local_total = 0;
      for (int stage = 0; stage < pp; ++stage) {
        for (int r = 0; r < tp; ++r) {
          const ParamLayout mine = gpt_param_layout(g, ModelShard{tp, r, pp, stage});
          local_total += mine.total;
          std::vector<float> local(size_t(mine.total));
          for (const ParamSpec& s : mine.specs) {
            const int64_t at = whole.find(s.name).offset;
            slice_from_full(s, r, full.data() + at, local.data() + s.offset);
            std::vector<float> back(full.size(), -1.f);
            place_into_full(s, r, local.data() + s.offset, back.data() + at);
            for (int64_t i = 0; i < s.numel; ++i) {  // the slice holds the right elements
              const size_t e = size_t(local[size_t(s.offset + i)]);
              ASSERT_EQ(back[e], float(e)) << s.name << " tp " << tp << " rank " << r;
              if (s.unique) hits[e]++;
            }
          }
        }
      }
      for (size_t e = 0; e < hits.size(); ++e) {
        ASSERT_EQ(hits[e], 1) << "element " << e << " at tp " << tp << " pp " << pp;
      }
      // Only replicated tensors and the tied head are held more than once.
      EXPECT_GE(local_total, whole.total);
    }
  }
}

TEST(ModelShard, StagesHoldTheirLayersAndTheTiedHead) {
  const GPTConfig g = make_gpt_config(5, 4, 32, 300, 16);
  const ParamLayout first = gpt_param_layout(g, ModelShard{1, 0, 2, 0});
  const ParamLayout last = gpt_param_layout(g, ModelShard{1, 0, 2, 1});
  EXPECT_NO_THROW(first.find("wte"));
  EXPECT_NO_THROW(first.find("h.2.mlp.c_fc.weight"));  // stage 0 has layers 0..2 of 5
  EXPECT_THROW(first.find("h.3.ln_1.weight"), Error);
  EXPECT_THROW(first.find("ln_f.weight"), Error);
  EXPECT_TRUE(first.find("wte").unique);
  EXPECT_FALSE(last.find("wte").unique) << "the LM head copy is not counted twice";
  EXPECT_NO_THROW(last.find("h.3.ln_1.weight"));
  EXPECT_THROW(last.find("wpe"), Error);
  // Column-parallel rows, row-parallel columns, q/k/v heads.
  const ParamLayout t = gpt_param_layout(g, ModelShard{2, 1, 1, 0});
  EXPECT_EQ(t.find("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(t.find("h.0.attn.c_proj.weight").shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(t.find("h.0.mlp.c_fc.bias").shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(t.find("wte").shape, (std::vector<int64_t>{192, 32}));  // Vp 384 / 2
  EXPECT_FALSE(t.find("h.0.ln_1.weight").unique) << "replicated on tp rank 1";
  EXPECT_THROW(gpt_param_layout(g, ModelShard{3, 0, 1, 0}), Error);  // 4 heads over tp 3
  EXPECT_THROW(gpt_param_layout(g, ModelShard{1, 0, 6, 0}), Error);  // 6 stages, 5 layers
}

TEST(ModelShard, RepadKeepsTheRealVocabularyRows) {
  const GPTConfig a = make_gpt_config(1, 2, 8, 130, 4);        // Vp 256
  const GPTConfig b = make_gpt_config(1, 2, 8, 130, 4, 512);   // Vp 512
  const ParamLayout la = gpt_param_layout(a);
  std::vector<float> full(size_t(la.total));
  std::iota(full.begin(), full.end(), 1.f);
  const std::vector<float> up = repad_vocab(full, a, b);
  const ParamLayout lb = gpt_param_layout(b);
  ASSERT_EQ(int64_t(up.size()), lb.total);
  EXPECT_EQ(up[size_t(130 * 8 - 1)], full[size_t(130 * 8 - 1)]);
  EXPECT_EQ(up[size_t(130 * 8)], 0.f) << "padded rows are zero";
  EXPECT_EQ(up[size_t(lb.find("wpe").offset)], full[size_t(la.find("wpe").offset)]);
  const std::vector<float> down = repad_vocab(up, b, a);
  for (const ParamSpec& s : la.specs) {
    const int64_t n = s.name == "wte" ? 130 * 8 : s.numel;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(down[size_t(s.offset + i)], full[size_t(s.offset + i)]) << s.name;
    }
  }
}

}  // namespace
}  // namespace berth
