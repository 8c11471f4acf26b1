#include "trainer_state.h"

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"

using json = nlohmann::json;

namespace fsdpx {

std::string TrainerState::to_json() const {
  json j{{"data", json::parse(data)}, {"seed", seed}, {"step", step}};
  if (hf_config) j["hf_config"] = json::parse(*hf_config);
  if (loss_scaler)
    j["loss_scaler"] = {{"state", json::parse(loss_scaler->state)}, {"skipped_steps", loss_scaler->skipped_steps}};
  return j.dump();
}

TrainerState TrainerState::from_json(const std::string& text) {
  // Without its data position a run cannot go on exactly where it stopped: refused, not guessed.
  if (text.empty())
    throw Error("checkpoint: it holds no trainer state (trainer_state.json), so the data position is unknown; "
                "it can initialise weights (--init-from) but not resume a run");
  if (const std::string why = trainer_state_problem(text, std::nullopt); !why.empty())
    throw Error("checkpoint: its trainer state " + why);
  const json j = json::parse(text);
  TrainerState s;
  s.step = j["step"].get<int64_t>();
  s.seed = j["seed"].get<uint64_t>();
  s.data = j["data"].dump();
  if (j.contains("hf_config")) s.hf_config = j["hf_config"].dump();
  if (j.contains("loss_scaler"))
    s.loss_scaler = LossScaling{j["loss_scaler"]["state"].dump(), j["loss_scaler"]["skipped_steps"].get<int64_t>()};
  return s;
}

}  // namespace fsdpx
