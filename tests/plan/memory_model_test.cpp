// The per-rank memory model against hand-computed values and against the bytes nn::GPT really
// allocates (a counting allocator around the CPU one).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/nn/gpt_costs.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/plan/memory_model.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/storage.h"
#include "meshtrain/util/error.h"
#include "tests/support/counting_allocator.h"

namespace meshtrain::plan {
namespace {

ModelShape gpt2_124m() {
  return ModelShape{12, 768, 12, 50257, 1024, true, true};
}

TEST(MemoryModel, ParameterCountsMatchGpt2) {
  // GPT-2 small as published (Hugging Face's gpt2 checkpoint): 124,439,808 parameters.
  EXPECT_EQ(model_params(gpt2_124m()), 124439808);
  // One block: 12 C^2 + 13 C.
  EXPECT_EQ(block_params(gpt2_124m()), 12 * 768 * 768 + 13 * 768);
}

TEST(MemoryModel, ZeroStagesFollowTheTextbookRatios) {
  MemoryInput in;
  in.model = gpt2_124m();
  in.dp = 4;
  const int64_t P = model_params(in.model);
  auto states = [&](int stage) {
    in.zero_stage = stage;
    const MemoryBreakdown b = estimate_memory(in);
    return b.parameters + b.gradients + b.optimizer_state;
  };
  // f32 AdamW: 16P, 8P + 8P/N, 4P + 12P/N, 16P/N.
  EXPECT_EQ(states(0), 16 * P);
  EXPECT_EQ(states(1), 8 * P + 8 * P / 4);
  EXPECT_EQ(states(2), 4 * P + 12 * P / 4);
  EXPECT_EQ(states(3), 16 * P / 4);
  in.optimizer = Optimizer::kSgdMomentum;
  EXPECT_EQ(states(0), 12 * P);
  in.optimizer = Optimizer::kAdamW;
  in.precision = Precision::kMixed;  // 2 + 4 + (4 + 8) = 18 bytes per parameter
  EXPECT_EQ(states(0), 18 * P);
}

// The planner's model cuts a pipeline by the plan check's rule (plan/pipeline_split.h): a stage
// per piece at most, the blocks, the embedding and the head all counting, and one message.
TEST(MemoryModel, PipelineDepthFollowsThePlanChecksRule) {
  MemoryInput in;
  in.model = ModelShape{2, 64, 4, 100, 32, true, true};
  in.micro_batches = 4;
  in.pp = 3;  // two blocks, the embedding and the head: four pieces for three stages
  EXPECT_NO_THROW(estimate_memory(in));
  in.pp = 5;
  try {
    estimate_memory(in);
    ADD_FAILURE() << "five stages for four pieces";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "config: parallel.pp x parallel.virtual_stages = 5 pipeline stages is more than "
                 "the model's 4 layers (model.n_layer = 2, the embedding and the head); lower "
                 "parallel.pp or add layers");
  }
}

TEST(MemoryModel, ActivationsByHand) {
  MemoryInput in;
  in.model = ModelShape{2, 64, 4, 100, 32, true, true};
  in.micro_batch = 3;
  // Per token: (16 C + NH T) * 4 + 16 bytes = (1024 + 128) * 4 + 16 = 4624.
  EXPECT_EQ(block_activation_bytes(in), 3 * 32 * 4624);
  in.tp = 2;  // (12 C + NH T) / 2 + 4 C = (768 + 128) / 2 + 256 = 704 elements
  EXPECT_EQ(block_activation_bytes(in), 3 * 32 * (704 * 4 + 16));
  in.sequence_parallel = true;  // everything halved: 576 elements, 8 bytes of statistics
  EXPECT_EQ(block_activation_bytes(in), 3 * 32 * (576 * 4 + 8));
}

// Under bf16 or f16 mixed precision flash attention keeps no NH x T weights, for the head sizes it
// runs (32, 64, 128); other heads keep the GEMM attention's f32 weights.
TEST(MemoryModel, MixedPrecisionKeepsAttentionWeightsWhereNoFlashKernelRuns) {
  MemoryInput in;
  in.precision = Precision::kMixed;
  in.micro_batch = 3;
  in.model = ModelShape{2, 128, 4, 100, 32, true, true};  // heads of 32: flash
  const int64_t flash = block_activation_bytes(in);
  // Per token: 16 C elements, 2 bytes each but the residual stream's 2C at 4, and 16 bytes of
  // statistics.
  EXPECT_EQ(flash, 3 * 32 * (16 * 128 * 2 + 2 * 128 * 2 + 16));
  in.model = ModelShape{2, 128, 8, 100, 32, true, true};  // heads of 16: no flash kernel
  EXPECT_EQ(block_activation_bytes(in), flash + 3 * 32 * 8 * 32 * 4);
  // f16 runs flash attention for the same head sizes, and is 2 bytes all the same;
  // train.precision's words map to the two.
  in.precision = Precision::kMixedF16;
  EXPECT_EQ(block_activation_bytes(in), flash + 3 * 32 * 8 * 32 * 4);
  in.model = ModelShape{2, 128, 4, 100, 32, true, true};
  EXPECT_EQ(block_activation_bytes(in), flash);
  EXPECT_EQ(parse_precision("f16"), Precision::kMixedF16);
  EXPECT_EQ(parse_precision("bf16"), Precision::kMixed);
  EXPECT_EQ(parse_precision("mixed"), Precision::kMixed);
  EXPECT_TRUE(is_mixed(Precision::kMixedF16) && !is_mixed(Precision::kF32));
}

TEST(MemoryModel, PipelineSchedulesHoldWhatTheyKeepInFlight) {
  MemoryInput in;
  in.model = ModelShape{8, 64, 4, 100, 32, true, true};
  in.pp = 4;
  in.micro_batches = 8;
  in.schedule = ScheduleKind::gpipe;
  const int64_t gpipe = estimate_memory(in).activations;
  in.schedule = ScheduleKind::one_f_one_b;
  const int64_t one_f_one_b = estimate_memory(in).activations;
  const int64_t block = block_activation_bytes(in), emb = 32 * 64 * 4;
  EXPECT_EQ(one_f_one_b, 4 * (2 * block + emb));  // p micro-batches of 2 blocks on stage 0
  EXPECT_EQ(gpipe, 8 * (2 * block + emb));        // all m
  in.schedule = ScheduleKind::interleaved;
  in.virtual_stages = 2;  // chunks of 1 block: 2(p-1) + (v-1)p + 1 = 11 in flight
  EXPECT_EQ(estimate_memory(in).activations, 11 * block + 4 * emb);
}

TEST(MemoryModel, APipelineThatDoesNotDivideTheLayersIsEstimatedForItsLargestStage) {
  // The trainer balances 10 blocks over 4 stages; no stage holds more than ceil(10 / 4) = 3,
  // so the estimate is that of 3 blocks per stage (what 12 blocks on 4 stages hold).
  MemoryInput in;
  in.model = ModelShape{10, 64, 4, 100, 32, true, true};
  in.pp = 4;
  in.micro_batches = 4;
  const MemoryBreakdown ten = estimate_memory(in);
  in.model.n_layer = 12;
  const MemoryBreakdown twelve = estimate_memory(in);
  EXPECT_EQ(ten.total(), twelve.total());
  EXPECT_EQ(ten.params_on_rank, twelve.params_on_rank);
}

TEST(MemoryModel, BadInputNamesTheField) {
  MemoryInput in;
  in.model = gpt2_124m();
  in.tp = 5;
  try {
    estimate_memory(in);
    FAIL() << "tp = 5 accepted for 12 heads";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp"), std::string::npos) << e.what();
  }
  in.tp = 1;
  in.pp = 15;  // more stages than the 12 blocks, the embedding and the head
  EXPECT_THROW(estimate_memory(in), ValueError);
  in.pp = 4;
  in.schedule = ScheduleKind::interleaved;
  in.virtual_stages = 5;  // 20 chunks of 12 blocks
  EXPECT_THROW(estimate_memory(in), ValueError);
  in.schedule = ScheduleKind::one_f_one_b;
  in.virtual_stages = 1;
  in.pp = 1;
  in.zero_stage = 4;
  EXPECT_THROW(estimate_memory(in), ValueError);
  EXPECT_THROW(parse_schedule_kind("zigzag"), ValueError);
}

struct Measured {
  int64_t params = 0, activations = 0, grads = 0, optimizer = 0, step_peak = 0;
};

Measured measure(const MemoryInput& in) {
  testing::CountingAllocator counting(allocator_for(DeviceType::cpu));
  set_allocator(DeviceType::cpu, &counting);
  Measured m;
  {
    nn::GPTConfig c;
    c.n_layer = in.model.n_layer;
    c.n_embd = in.model.n_embd;
    c.n_head = in.model.n_head;
    c.vocab_size = in.model.vocab_size;
    c.block_size = in.model.block_size;
    c.moe = in.moe;
    c.checkpointed_blocks = nn::parse_activation_checkpointing(
        in.checkpoint_every == 0 ? "none" : "every:" + std::to_string(in.checkpoint_every),
        c.n_layer);
    const int64_t t0 = counting.live();
    nn::GPT model(c);
    m.params = counting.live() - t0;
    optim::AdamWOptions opt;
    optim::AdamW adamw(model.named_parameters(), opt);
    Generator g(3);
    const int64_t B = in.micro_batch, T = in.model.block_size;
    std::vector<int32_t> ids(static_cast<size_t>(B * T));
    for (auto& t : ids) t = static_cast<int32_t>(g.below(static_cast<uint64_t>(c.vocab_size)));
    Tensor x = Tensor::from_vector(ids, {B, T}), y = Tensor::from_vector(ids, {B, T});
    for (int step = 0; step < 2; ++step) {  // the second step sees gradients and state alive
      const int64_t before = counting.live();
      counting.reset_peak();
      Tensor loss = model.loss(x, y, 5);
      m.activations = counting.live() - before;
      autograd::backward(loss);
      loss = Tensor();
      const int64_t after_backward = counting.live();
      if (step == 0) m.grads = after_backward - before;
      adamw.step();
      if (step == 0) m.optimizer = counting.live() - after_backward;
      m.step_peak = counting.peak() - before;
    }
  }
  set_allocator(DeviceType::cpu, nullptr);
  return m;
}

double rel(int64_t predicted, int64_t measured) {
  return std::abs(static_cast<double>(predicted - measured)) / static_cast<double>(measured);
}

TEST(MemoryModel, MatchesWhatGptAllocates) {
  for (int64_t every : {0, 1, 2}) {
    MemoryInput in;
    in.model = ModelShape{4, 64, 4, 97, 32, true, true};
    in.micro_batch = 4;
    in.checkpoint_every = every;
    const MemoryBreakdown b = estimate_memory(in);
    const Measured m = measure(in);
    std::printf(
        "checkpoint_every %lld: params %lld/%lld activations %lld/%lld grads %lld/%lld optimizer "
        "%lld/%lld (predicted/measured bytes); backward peak %lld, predicted activations + "
        "buffers %lld\n",
        static_cast<long long>(every), static_cast<long long>(b.parameters),
        static_cast<long long>(m.params), static_cast<long long>(b.activations),
        static_cast<long long>(m.activations), static_cast<long long>(b.gradients),
        static_cast<long long>(m.grads), static_cast<long long>(b.optimizer_state),
        static_cast<long long>(m.optimizer), static_cast<long long>(m.step_peak),
        static_cast<long long>(b.activations + b.buffers));
    EXPECT_EQ(b.parameters, m.params);
    EXPECT_EQ(b.gradients, m.grads);
    EXPECT_EQ(b.optimizer_state, m.optimizer);
    EXPECT_LT(rel(b.activations, m.activations), 0.02) << "checkpoint_every " << every;
    // The peak of a step with gradients and state alive: activations, the backward working set
    // (buffers) and nothing more than 10% besides.
    EXPECT_LT(rel(b.activations + b.buffers, m.step_peak), 0.10) << "checkpoint_every " << every;
  }
}

// Mixture-of-experts blocks: every expert's parameters, gradients (an expert without tokens
// gets a zero one) and optimizer state exactly, and the activations of top-k experts' rows, the
// gathered inputs and the router within a few percent of what the model allocates.
TEST(MemoryModel, MatchesWhatAnMoeGptAllocates) {
  for (int64_t k : {1, 2}) {
    MemoryInput in;
    in.model = ModelShape{4, 64, 4, 97, 32, true, true};
    in.moe.every = 2;
    in.moe.num_experts = 4;
    in.moe.top_k = k;
    in.moe.expert_hidden = 128;
    in.moe.drop_tokens = false;
    in.micro_batch = 4;
    const MemoryBreakdown b = estimate_memory(in);
    const Measured m = measure(in);
    std::printf("top-%lld: params %lld/%lld activations %lld/%lld (predicted/measured bytes)\n",
                static_cast<long long>(k), static_cast<long long>(b.parameters),
                static_cast<long long>(m.params), static_cast<long long>(b.activations),
                static_cast<long long>(m.activations));
    EXPECT_EQ(b.parameters, m.params);
    EXPECT_EQ(b.gradients, m.grads);
    EXPECT_EQ(b.optimizer_state, m.optimizer);
    EXPECT_LT(rel(b.activations, m.activations), 0.02) << "top " << k;
    // Each of two expert-parallel ranks holds half of every MoE block's experts.
    MemoryInput half = in;
    half.ep = 2;
    half.dp = 2;
    nn::GPTConfig c = gpt_config(in.model);
    c.moe = in.moe;
    EXPECT_EQ(estimate_memory(half).params_on_rank,
              b.params_on_rank - 2 * 2 * nn::gpt_expert_params(c));
  }
  MemoryInput bad;
  bad.moe.every = 1;
  bad.moe.num_experts = 4;
  bad.ep = 3;
  EXPECT_THROW(estimate_memory(bad), ValueError);
}

}  // namespace
}  // namespace meshtrain::plan
