#include "fsdpx/framework/trainer/checkpoint_state.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/runtime/every_rank.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/trainer/checkpoint_saver.h"

namespace fsdpx {
namespace {

constexpr const char* kOptimPrefix = "optim/";

std::map<std::string, std::vector<int64_t>> plan_shapes(const ShardingEngine& engine) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& u : engine.plan().units)
    for (size_t i = 0; i < u.names.size(); ++i) shapes[u.names[i]] = u.shapes[i];
  return shapes;
}

// A parameter's real rows on this rank, as a view of its shard.
TensorShard param_rows(const ParamShard& p, const std::vector<int64_t>& shape, const ShardingEngine& engine) {
  const ShardGeometry geo(shape, engine.shard_size());
  const int shard_rank = engine.shard_rank();
  const int64_t offset = geo.first_row(shard_rank), valid = geo.valid_rows(shard_rank);
  at::Tensor param = p.param.detach();
  at::Tensor local =
      shape.empty() ? (shard_rank == 0 ? param.reshape({}) : param.narrow(0, 0, 0)) : param.narrow(0, 0, valid);
  return {p.name, local, shape, offset};
}

const std::vector<int64_t>& shape_of(const std::map<std::string, std::vector<int64_t>>& shapes,
                                     const std::string& name) {
  auto it = shapes.find(name);
  if (it == shapes.end()) throw Error("checkpoint: parameter '" + name + "' is not in the engine's plan (a bug)");
  return it->second;
}

}  // namespace

CheckpointState checkpoint_state(const ShardingEngine& engine, const Optimizer& optimizer, bool for_load) {
  at::NoGradGuard no_grad;
  const auto shapes = plan_shapes(engine);
  CheckpointState st;
  for (const ParamShard& p : engine.shards()) {
    const std::vector<int64_t>& shape = shape_of(shapes, p.name);
    st.tensors.push_back(param_rows(p, shape, engine));
    if (!p.param.requires_grad()) continue;  // frozen: no optimizer state
    const ShardGeometry geo(shape, engine.shard_size());
    const int64_t offset = st.tensors.back().row_offset, valid = rows_of(st.tensors.back().local);
    for (const auto& [key, t] : optimizer.state(p.name)) {
      at::Tensor c = for_load ? t.detach().clone() : t.detach();
      if (t.dim() > 0 && t.size(0) == geo.rows_per_shard && !shape.empty()) {
        std::vector<int64_t> g = t.sizes().vec();
        g[0] = geo.rows;
        st.tensors.push_back({kOptimPrefix + p.name + "/" + key, c.narrow(0, 0, valid), g, offset});
      } else {
        st.tensors.push_back({kOptimPrefix + p.name + "/" + key, c, t.sizes().vec(), 0});
      }
    }
  }
  return st;
}

CheckpointState weights_state(const ShardingEngine& engine) {
  at::NoGradGuard no_grad;
  const auto shapes = plan_shapes(engine);
  CheckpointState st;
  for (const ParamShard& p : engine.shards()) st.tensors.push_back(param_rows(p, shape_of(shapes, p.name), engine));
  return st;
}

HostStaging stage_on_host(CheckpointState& st) {
  HostStaging staging;
  for (TensorShard& t : st.tensors) {
    if (!t.local.defined() || t.local.is_cpu()) continue;
    at::Tensor host = t.local.to(at::kCPU);
    staging.device_and_host.emplace_back(t.local, host);
    t.local = host;
  }
  return staging;
}

void HostStaging::copy_back() const {
  at::NoGradGuard no_grad;
  for (const auto& [device, host] : device_and_host) device.copy_(host);
}

std::unique_ptr<CheckpointSaver> make_checkpoint_saver(StreamedCheckpointBackend& backend, const ProcessGroups& groups,
                                                       const ShardingEngine& engine,
                                                       std::shared_ptr<const DeviceRuntime> device) {
  const CheckpointContext main = checkpoint_context(groups, engine);
  const CheckpointContext background =
      backend.saves_in_background() ? checkpoint_context(groups.new_control_group("checkpoint"), engine) : main;
  return std::make_unique<CheckpointSaver>(backend, main, background, std::move(device));
}

namespace {

// Tensor `s` whole from every rank's rows (metas[r] = rank r's {offset, rows}): one all-gather of
// the rows padded to the largest share, assembled on every rank (`only` >= 0: on that rank alone;
// the others get an undefined tensor).
at::Tensor assemble_whole(Communicator& world, const TensorShard& s, const std::vector<std::vector<int64_t>>& metas,
                          int only) {
  const int W = world.size();
  at::Tensor local = s.local.contiguous();
  const std::vector<int64_t>& shape = s.global_shape;
  int64_t most = 0;
  for (int r = 0; r < W; ++r) most = std::max(most, metas[r][1]);
  const int64_t row = row_numel(shape);
  at::Tensor mine = local.reshape({-1});  // a full share goes as it is; a short one is padded
  if (local.numel() != most * row) {
    mine = at::zeros({most * row}, local.options());
    if (local.numel() > 0) mine.narrow(0, 0, local.numel()).copy_(local.reshape({-1}));
  }
  at::Tensor all = at::empty({W * most * row}, local.options());
  world.all_gather(all, mine).wait();
  if (only >= 0 && world.rank() != only) return at::Tensor();
  // When rank r holds rows [r * most, r * most + most) (a short share only at the end), the
  // gathered buffer already is the tensor.
  bool in_rank_order = true;
  for (int r = 0; r < W; ++r) {
    const int64_t off = metas[r][0], n = metas[r][1];
    in_rank_order = in_rank_order && (n == 0 || off == r * most) && (n == most || off + n == rows_of(shape) || n == 0);
  }
  if (in_rank_order && rows_of(shape) <= W * most) {  // a copy when the padding would stay with it
    at::Tensor t = all.narrow(0, 0, rows_of(shape) * row);
    return (rows_of(shape) == W * most ? t : t.clone()).reshape(shape);
  }
  at::Tensor full = at::empty({rows_of(shape) * row}, local.options());
  for (int r = 0; r < W; ++r) {
    const int64_t off = metas[r][0], n = metas[r][1];
    if (n > 0) full.narrow(0, off * row, n * row).copy_(all.narrow(0, r * most * row, n * row));
  }
  return full.reshape(shape);
}

}  // namespace

std::vector<at::Tensor> gather_whole(Communicator& world, const std::vector<TensorShard>& shards) {
  std::vector<at::Tensor> out;
  if (world.size() == 1) {
    for (const TensorShard& s : shards) out.push_back(s.local.contiguous().reshape(s.global_shape).clone());
    return out;
  }
  std::vector<int64_t> mine;  // every tensor's {offset, rows}: one exchange for all of them
  for (const TensorShard& s : shards) {
    mine.push_back(s.row_offset);
    mine.push_back(rows_of(s.local));
  }
  const auto all = from_every_rank(world, mine);
  for (size_t i = 0; i < shards.size(); ++i) {
    std::vector<std::vector<int64_t>> metas;
    for (const auto& r : all) metas.push_back({r[2 * i], r[2 * i + 1]});
    out.push_back(assemble_whole(world, shards[i], metas, -1));
  }
  return out;
}

CheckpointContext checkpoint_context(const ProcessGroups& groups, const ShardingEngine& engine) {
  return checkpoint_context(groups.control(), engine);
}

CheckpointContext checkpoint_context(std::shared_ptr<Communicator> world, const ShardingEngine& engine) {
  CheckpointContext ctx;
  ctx.rank = world->rank();
  ctx.world_size = world->size();
  ctx.primary = engine.replicate_rank() == 0;
  ctx.barrier = [world] { world->barrier().wait(); };
  ctx.all_sum = [world](std::vector<int64_t>& v) {
    if (world->size() == 1 || v.empty()) return;
    at::Tensor t = at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kLong).clone();
    world->all_reduce(t, ReduceOp::Sum).wait();
    std::memcpy(v.data(), t.data_ptr<int64_t>(), v.size() * sizeof(int64_t));
  };
  ctx.gather_to_rank0 = [world](const TensorShard& s) -> at::Tensor {
    if (world->size() == 1) return s.local.contiguous().reshape(s.global_shape).clone();
    const auto metas = from_every_rank(*world, std::vector<int64_t>{s.row_offset, rows_of(s.local)});
    at::Tensor whole = assemble_whole(*world, s, metas, 0);
    return world->rank() == 0 ? whole : at::Tensor();
  };
  return ctx;
}

void load_optimizer_state(const CheckpointState& st, Optimizer& optimizer) {
  at::NoGradGuard no_grad;
  std::map<std::string, std::vector<const TensorShard*>> by_param;
  for (const auto& t : st.tensors)
    if (t.name.rfind(kOptimPrefix, 0) == 0) {
      const std::string rest = t.name.substr(std::strlen(kOptimPrefix));
      by_param[rest.substr(0, rest.rfind('/'))].push_back(&t);
    }
  for (const auto& [param, tensors] : by_param) {
    ShardState current = optimizer.state(param), updated;
    for (const auto& [key, t] : current) {
      const std::string name = kOptimPrefix + param + "/" + key;
      auto it = std::find_if(tensors.begin(), tensors.end(), [&](const TensorShard* s) { return s->name == name; });
      if (it == tensors.end()) throw Error("checkpoint: optimizer state '" + name + "' was not loaded");
      at::Tensor fresh = t.detach().clone();
      const at::Tensor& loaded = (*it)->local;
      if (loaded.dim() > 0 && fresh.dim() > 0 && loaded.size(0) <= fresh.size(0) && loaded.sizes() != fresh.sizes())
        fresh.narrow(0, 0, loaded.size(0)).copy_(loaded);
      else
        fresh.copy_(loaded.reshape(fresh.sizes()));
      updated.emplace_back(key, fresh);
    }
    optimizer.load_state(param, updated);
  }
}

bool load_checkpoint(const std::string& dir, CheckpointState& st, const std::function<void(CheckpointState&)>& load,
                     const OtherNames& other_names) {
  if (!is_dcp_checkpoint(dir)) {
    load(st);
    return false;
  }
  std::vector<std::string> ours, theirs;
  for (const TensorShard& t : st.tensors) ours.push_back(t.name);
  try {
    theirs = dcp_names(dir, ours, other_names);
  } catch (const Error&) {
    theirs = ours;  // the load reads the folder again, and every rank stops there with its error
  }
  for (size_t i = 0; i < st.tensors.size(); ++i) st.tensors[i].name = theirs[i];
  try {
    load(st);
  } catch (...) {
    for (size_t i = 0; i < st.tensors.size(); ++i) st.tensors[i].name = ours[i];
    throw;
  }
  for (size_t i = 0; i < st.tensors.size(); ++i) st.tensors[i].name = ours[i];
  const std::string suffix = "/step";
  std::optional<double> step;
  std::string first;
  for (const TensorShard& t : st.tensors) {
    const bool is_step = t.name.rfind(kOptimPrefix, 0) == 0 && t.name.size() > suffix.size() &&
                         t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
                         t.local.numel() == 1;
    if (!is_step) continue;
    const double v = t.local.item<double>();
    if (step && *step != v)
      throw Error("checkpoint " + dir + ": the optimizer's step is " + std::to_string(static_cast<int64_t>(*step)) +
                  " for '" + first + "' and " + std::to_string(static_cast<int64_t>(v)) + " for '" + t.name +
                  "'; fsdpx takes one step for the whole model");
    if (!step) first = t.name;
    step = v;
  }
  st.step = step ? static_cast<int64_t>(*step) : 0;
  return true;
}

}  // namespace fsdpx
