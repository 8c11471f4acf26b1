// fsdpx/checkpoint_names.h: an optional capability for models whose parameters another trainer
// names otherwise (the gpt plugin: torchtitan's Llama).
//
// A model offers it by inheriting the mix-in besides its interface, as with fsdpx/hf_interop.h:
//
//   class Gpt final : public fsdpx::Model, public fsdpx::CheckpointNames { ... };
//
// When a run reads a folder that PyTorch's distributed checkpointing wrote (--init-from, --resume),
// a parameter the folder does not hold under its own name is looked for under these names, in
// order, and its optimizer state under DCP's flattened names of each (docs/checkpoints.md).
// Additive: plugins built without it load as before.
#pragma once

#include <string>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

class FSDPX_API CheckpointNames {
 public:
  virtual ~CheckpointNames();
  // The names another trainer's checkpoint may hold parameter `name` under, most likely first
  // ("layers.0.attention.wq" -> {"layers.0.attention.wq.weight", "layers.0.attention.qkv_linear.wq.weight"});
  // none when the parameter has no other name.
  virtual std::vector<std::string> other_checkpoint_names(const std::string& name) const = 0;
};

}  // namespace fsdpx
