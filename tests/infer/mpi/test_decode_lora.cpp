// Many LoRA adapters over one base in one decode batch (S-LoRA): requests of two adapters of
// different ranks and maps (the second in a pool slot laid out for the first's rank) and of
// the base run together, and every generated position's log-probabilities equal the
// training model's full forward with that request's adapter (or none), on one rank (np1) and
// tp 2 x pp 2 (np4).
#include <gtest/gtest.h>

#include "decode_support.h"
#include "jumbo/infer/scheduler.h"
#include "jumbo/model/lora.h"

namespace jumbo {
namespace {

using namespace decode_test;

// A stage's adapters with B random too (a fresh B is zero, which would leave the base).
std::unique_ptr<ParamStore> random_adapters(const ModelConfig& m, const StageOptions& stage,
                                            int64_t tp_rank, int64_t tp, Backend& backend,
                                            uint64_t seed) {
  auto store = std::make_unique<ParamStore>();
  for (ParamInfo& p : lora_stage_params(m, stage, tp_rank, tp)) {
    p.init = InitKind::normal;
    p.init_std = p.name.ends_with("lora_b") ? 0.2f : 0.1f;
    store->add(std::move(p));
  }
  store->allocate(backend, DType::f32, 1, GradBuffer::none);
  store->initialize(backend, seed);
  return store;
}

// `widest`: the first adapter's maps (the second has qkv and fc2).
void expect_mixed_adapters_equal_full_forward(const ModelConfig& m, LoraTargetSet widest) {
  std::shared_ptr<Comm> world = mpi_world();
  const auto [tp, pp] = layout_for(world->size());
  auto backend = make_cpu_backend();
  LoraTargetSet two = LoraTargetSet::none();
  two.add(LoraTarget::qkv);
  two.add(LoraTarget::fc2);
  const std::vector<LoraShape> shapes = {{.rank = 4, .alpha = 8, .targets = widest},
                                         {.rank = 2, .alpha = 6, .targets = two}};
  const std::vector<uint64_t> seeds = {101, 202};
  auto made = make_engine(*backend, {.max_rows = 6, .max_sampled = 4, .cache_slots = 4,
                                     .adapter_slots = 2, .max_lora_rank = 4}, m);
  GenerationEngine& engine = *made;
  Grid grid(world, static_cast<int>(tp), static_cast<int>(pp));
  Layout layout;
  layout.tp = tp;
  layout.pp = pp;
  auto stage_of = [&](const LoraShape& lora) {
    return plan_stage(m, layout, StepShape{.lora = lora}, grid.coords()).model;
  };
  for (size_t k = 0; k < shapes.size(); ++k) {
    auto store = random_adapters(m, stage_of(shapes[k]), grid.tp_rank(), tp, *backend, seeds[k]);
    engine.decoder().set_adapter(static_cast<int32_t>(k), *store, shapes[k]);
  }

  // Four requests through four slots: adapter 0, the base, adapter 1, adapter 0 again, with
  // prompts longer than a step (chunked prefill next to decode rows of other adapters).
  const std::vector<std::vector<int32_t>> prompts = {
      {11, 200, 3, 57, 400, 9, 81, 4, 33}, {5, 6, 7}, {300, 301, 12, 90, 91, 92, 93}, {8, 9}};
  const std::vector<int32_t> adapter = {0, -1, 1, 0};
  const std::vector<int64_t> new_tokens = {7, 9, 6, 8};
  std::vector<std::vector<TokenPick>> picks(prompts.size());
  int64_t mixed = 0;
  if (engine.leader()) {
    Scheduler scheduler(engine, /*eos_id=*/-1);
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_new_tokens = new_tokens[i];
      r.sampling.logprobs = m.vocab;
      r.stop_at_eos = false;
      r.adapter = adapter[i];
      scheduler.submit(r, [&picks, i](const TokenEvent& e) {
        picks[i].push_back(e.pick);
        return true;
      });
    }
    while (!scheduler.idle()) scheduler.step();
    mixed = scheduler.mixed_steps();
    engine.stop_followers();
  } else {
    engine.follow();
  }
  if (engine.leader()) {
    EXPECT_GT(mixed, 0) << "no step mixed adapters";
  }
  std::vector<double> moved(prompts.size(), 0);  // how far the adapter moved the logprobs
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> seq = final_sequence(*world, prompts[i], picks[i]);
    ASSERT_EQ(seq.size(), prompts[i].size() + static_cast<size_t>(new_tokens[i]));
    const LoraShape lora = adapter[i] < 0 ? LoraShape{} : shapes[static_cast<size_t>(adapter[i])];
    const auto full = full_forward_logprobs(
        m, tp, pp, seq, lora, [&](ParamStore& into, Backend& be) {
          auto values = random_adapters(m, stage_of(lora), grid.tp_rank(), tp, be,
                                        seeds[static_cast<size_t>(adapter[i])]);
          for (size_t p = 0; p < into.size(); ++p) {
            be.copy(into.weight(static_cast<int>(p)), values->weight(static_cast<int>(p)));
          }
        });
    const auto base = full_forward_logprobs(m, tp, pp, seq);
    if (!engine.leader()) continue;
    double worst = 0;
    for (size_t k = 0; k < picks[i].size(); ++k) {
      const std::vector<double>& row = full[prompts[i].size() - 1 + k];
      const std::vector<double>& base_row = base[prompts[i].size() - 1 + k];
      for (const auto& [id, lp] : picks[i][k].top) {
        worst = std::max(worst, std::abs(lp - row[static_cast<size_t>(id)]));
        moved[i] = std::max(moved[i], std::abs(row[static_cast<size_t>(id)] - base_row[static_cast<size_t>(id)]));
      }
    }
    EXPECT_LT(worst, 1e-5) << "request " << i << " (adapter " << adapter[i] << ")";
    if (adapter[i] >= 0) {
      EXPECT_GT(moved[i], 1e-2) << "adapter " << adapter[i] << " changed nothing";
    }
  }
}

TEST(CachedDecodeLora, MixedAdaptersAndBaseEqualEachFullForward) {
  expect_mixed_adapters_equal_full_forward(tiny(), LoraTargetSet{});
}

// The Llama block's every map as PEFT names them (q, k, v in their grouped rows, o, SwiGLU's
// gate and up in its packed output, down) next to an adapter on the whole q/k/v map.
TEST(CachedDecodeLora, LlamaMixedAdaptersAndBaseEqualEachFullForward) {
  expect_mixed_adapters_equal_full_forward(tiny_llama(), every_lora_target(tiny_llama()));
}

}  // namespace
}  // namespace jumbo
