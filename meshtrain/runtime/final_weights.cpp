#include "meshtrain/runtime/final_weights.h"

#include <chrono>
#include <filesystem>

#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/obs/trace.h"

namespace meshtrain::runtime {

void FinalWeights::on_end(RunState& run) {
  if (run.result.preempted) return;
  const TrainConfig& c = run.config.config;
  // The others would only add a whole model each to the job's peak memory.
  if (c.train.save_weights || run.task.prints_sample()) run.engine.consolidate(0);
  if (run.rank != 0 || !c.train.save_weights) return;
  const std::string path = (std::filesystem::path(c.train.out_dir) / "model.safetensors").string();
  run.result.weights_path = path;
  const auto start = std::chrono::steady_clock::now();
  {
    obs::TraceSpan span("checkpoint");
    ckpt::save_safetensors(path, run.engine.model().state_dict(),
                           {{"format", "pt"}, {"meshtrain_config", to_json(c).dump()}});
  }
  const auto event = metrics_.run_observer().on_checkpoint(
      c.train.steps,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      static_cast<int64_t>(std::filesystem::file_size(path)), true);
  metrics_.write(event, true);
  run.log("saved weights to " + path, nullptr);
}

}  // namespace meshtrain::runtime
