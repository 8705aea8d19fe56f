// See best_checkpoint.h.
#include "meshtrain/runtime/best_checkpoint.h"

#include <bit>
#include <cmath>
#include <filesystem>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

namespace fs = std::filesystem;

std::optional<float> recorded_val_loss(const nlohmann::json& train_state) {
  auto it = train_state.find("val_loss");
  if (it == train_state.end() || !it->is_number()) return std::nullopt;
  return it->get<float>();
}

}  // namespace

bool BestCheckpoint::improves(float val_loss) const {
  return std::isfinite(val_loss) && (!loss_ || val_loss < *loss_);
}

void BestCheckpoint::accept(int64_t step, float val_loss) {
  step_ = step;
  loss_ = val_loss;
}

void BestCheckpoint::restore(const std::string& root, int64_t resumed_step,
                             const nlohmann::json& resumed_state, int rank,
                             comm::ProcessGroup* group, const LogFn& log) {
  // [step, loss as its bits, has loss]: rank 0's view, broadcast so that no rank reads the
  // pointer while rank 0 repairs it.
  int64_t msg[3] = {-1, 0, 0};
  if (rank == 0 && enabled_) {
    std::optional<int64_t> step = ckpt::read_pointer_step(root, ckpt::kBestFile);
    std::optional<float> loss;
    if (step) {
      const std::string dir = (fs::path(root) / ckpt::step_dir_name(*step)).string();
      if (fs::is_regular_file(fs::path(dir) / ckpt::kManifestFile)) {
        loss = recorded_val_loss(ckpt::read_manifest(dir).train_state);
      } else {
        log(root + "/" + ckpt::kBestFile + " names " + ckpt::step_dir_name(*step) +
            ", which is not a complete checkpoint; the best is tracked afresh");
        step.reset();
      }
    }
    const std::optional<float> resumed = recorded_val_loss(resumed_state);
    if (resumed_step > 0 && resumed && resumed_state.value("best", false) &&
        std::isfinite(*resumed) && (!loss || *resumed < *loss) && step != resumed_step) {
      log(detail::str_cat(
          "the checkpoint of step ", resumed_step, " was saved as the best (val_loss ", *resumed,
          ") but ", root, "/", ckpt::kBestFile, " names ",
          step ? ckpt::step_dir_name(*step) : std::string("nothing"),
          " (the save was interrupted); pointing it at ", ckpt::step_dir_name(resumed_step)));
      ckpt::write_best(root, resumed_step);
      step = resumed_step;
      loss = resumed;
    }
    if (step && loss) {
      msg[0] = *step;
      msg[1] = std::bit_cast<int32_t>(*loss);
      msg[2] = 1;
    }
  }
  if (group != nullptr) group->broadcast(msg, 3, DType::i64)->wait();
  if (msg[2] != 0) accept(msg[0], std::bit_cast<float>(static_cast<int32_t>(msg[1])));
}

}  // namespace meshtrain::runtime
