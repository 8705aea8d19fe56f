// Engines for tests, built the one way the trainer builds them (parallel::make_engine), from a
// GPT configuration or a GPT the test made itself (to hook or inspect it).
#pragma once

#include <memory>
#include <utility>

#include "meshtrain/models/gpt_source.h"
#include "meshtrain/parallel/engine.h"

namespace meshtrain::testing {

// A GPT source whose whole model (tp = 1) is the one given.
class PrebuiltGptSource : public models::GptSource {
 public:
  explicit PrebuiltGptSource(std::shared_ptr<nn::GPT> gpt)
      : GptSource(gpt->config()), gpt_(std::move(gpt)) {}
  std::shared_ptr<parallel::TrainModel> build(const parallel::tp::TpContext& tp) const override {
    if (tp.size() > 1 || !gpt_) return GptSource::build(tp);
    return std::make_shared<models::GptModel>(std::exchange(gpt_, nullptr));
  }

 private:
  mutable std::shared_ptr<nn::GPT> gpt_;
};

inline std::unique_ptr<parallel::TrainEngine> gpt_engine(
    std::shared_ptr<const parallel::ModelSource> source, parallel::DeviceMesh mesh,
    const parallel::EngineOptions& options, Device device = Device::cpu()) {
  parallel::EngineSpec spec;
  spec.model = std::move(source);
  spec.mesh = std::move(mesh);
  spec.device = device;
  spec.options = options;
  return parallel::make_engine(std::move(spec));
}

// On the mesh {pp, dp, tp} given.
inline std::unique_ptr<parallel::TrainEngine> gpt_engine(
    const nn::GPTConfig& config, parallel::DeviceMesh mesh,
    const parallel::EngineOptions& options = parallel::EngineOptions()) {
  return gpt_engine(std::make_shared<models::GptSource>(config), std::move(mesh), options);
}

// Data-parallel over `world` (null: one process).
inline std::unique_ptr<parallel::TrainEngine> gpt_engine(
    const nn::GPTConfig& config, comm::ProcessGroupPtr world,
    const parallel::EngineOptions& options = parallel::EngineOptions()) {
  return gpt_engine(config, parallel::data_parallel_mesh(std::move(world)), options);
}

// Data-parallel over `world` with a GPT the test made.
inline std::unique_ptr<parallel::TrainEngine> gpt_engine(
    std::shared_ptr<nn::GPT> gpt, comm::ProcessGroupPtr world,
    const parallel::EngineOptions& options = parallel::EngineOptions()) {
  return gpt_engine(std::make_shared<PrebuiltGptSource>(std::move(gpt)),
                    parallel::data_parallel_mesh(std::move(world)), options);
}

}  // namespace meshtrain::testing
