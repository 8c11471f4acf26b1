// A folder PyTorch's distributed checkpointing (DCP) wrote as safetensors, read as a sharded
// checkpoint's index: HuggingFaceStorageWriter's files (every rank's shard-*-model-*.safetensors
// with DCP_SHARDING_INFO, or, consolidated, whole tensors) and FileSystemWriter's with
// serialization_format=SAFETENSORS (*.distcp). The folder's own files, not its subfolders, as
// DCP's HuggingFaceStorageReader reads them.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace fsdpx::ckpt {

// Whether `dir` holds files DCP's safetensors layer writes (*.safetensors or *.distcp) and none
// of fsdpx's own sharded checkpoint (index.json, trainer_state.json, rank-NNNNN files: without
// its index, that is a save cut short) nor a model.safetensors (fsdpx's consolidated checkpoint, a
// Hugging Face directory): then dcp_index reads it.
bool is_dcp_folder(const std::string& dir);

// The index of such a folder, in index.json's form ("fsdpx-sharded", version 1, step 0,
// "written_by": "dcp", no digests: DCP records none): each tensor's pieces from its chunks, every chunk a run of whole
// rows (dim 0) at DCP_SHARDING_INFO's saved_offsets (0 without it, a whole tensor). Throws
// fsdpx::Error in one line naming the tensor or file for what fsdpx cannot read: a chunk cut along
// another dimension than 0 (tensor parallel), chunks that leave rows out or hold some twice, chunks
// of one tensor that differ in dtype or row shape, a dtype safetensors does not define, and DCP's
// pickled .distcp (naming the safetensors options PyTorch offers, and scripts/dcp_to_safetensors.py).
nlohmann::json dcp_index(const std::string& dir);

}  // namespace fsdpx::ckpt
