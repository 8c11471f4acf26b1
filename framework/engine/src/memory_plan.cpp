#include "fsdpx/framework/engine/memory_plan.h"

#include <algorithm>
#include <map>
#include <utility>

#include "byte_ledger.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "replayed_unit.h"
#include "step_order.h"
#include "step_timeline.h"

namespace fsdpx {
namespace {

// A recomputed unit's forward runs without a graph, so each of a layer's intermediates is freed
// once its consumer ran: at its worst moment, an estimated three quarters of what the layer would
// save are alive at once. An estimate, not a measurement of each model: the PredictedPeak tests'
// recomputed cases (gpt tiny and small, vit) hold the peaks it gives within 10% of the measured.
constexpr int64_t kRecomputedLiveQuarters = 3;

// The engine's step, replayed in bytes.
class Replay {
 public:
  explicit Replay(const StepMemoryInput& in);
  StepMemory run();

 private:
  void map_layers();
  void map_gradients();
  std::vector<LayerCost> layer_costs() const;
  int unit_of(const std::string& path) const;
  void forward_pass();
  void keep_input(int u);
  int64_t input_of(int u) const { return layers_[first_layer_[static_cast<size_t>(u)]].input; }
  void backward_pass(bool sync);
  void start_backward(int u);
  void layer_backward(size_t l, bool sync);
  void post_backward(int u, bool sync);
  void progress(int u);
  void unshard(int u, bool forward);
  int64_t gather_input(int u) const;
  void prefetch_after(int u, const std::vector<int>& order);
  void reduce(int u);
  void finish_in_flight();
  void finish_replicate();
  void gradients_final(int u);
  void trace(const char* what, int u) const {
    trace_step(in_.step_trace, what, u == 0, in_.units[static_cast<size_t>(u)].fqn);
  }
  bool sharded() const { return in_.layout.shard_group_size > 1; }  // a gather is an all-gather

  const StepMemoryInput& in_;
  std::vector<LayerActivations> layers_;
  std::vector<ReplayedUnit> units_;
  std::vector<int> layer_unit_;
  std::vector<int64_t> layer_grad_elements_, layer_grad_bytes_;
  std::vector<size_t> first_layer_, last_layer_;  // per unit, in forward order
  std::vector<int> forward_order_;                // units by their first layer
  Ledger ledger_;
  StepTimeline timeline_;
  // The step's state, as ParamGroup and Unit hold it.
  std::vector<bool> gathered_, prefetched_, started_, progressed_, done_, grads_held_, shard_held_;
  std::vector<bool> kept_;  // the post-forward part kept from forward (ParamGroup::post_forward)
  std::vector<int64_t> seen_;
  // Activation offload: the unit whose input's copy to the host may still run (kept until the
  // next one leaves or the forward ends), and the inputs back on the device for backward.
  int offloading_ = -1;
  int release_after_ = -1;  // the one before it, whose input goes once this unit's forward has run
  std::vector<bool> loaded_;
  int64_t activation_host_ = 0;
  int in_flight_ = -1;
  int64_t in_flight_bytes_ = 0;  // what its finish frees
  int replicating_ = -1;         // hybrid: the unit whose all-reduce across replicas is in flight
};

Replay::Replay(const StepMemoryInput& in) : in_(in), layers_(in.layers), timeline_(nullptr, {}, 0) {
  for (size_t i = 0; i < in.units.size(); ++i) units_.push_back(replayed_unit(in.units[i], i == 0, in));
  map_layers();
  map_gradients();
  timeline_ = StepTimeline(in.costs, layer_costs(), units_.size());
  const size_t n = units_.size();
  gathered_.assign(n, false);
  prefetched_ = started_ = progressed_ = done_ = grads_held_ = shard_held_ = kept_ = loaded_ = gathered_;
  seen_.assign(n, 0);
}

// The unit whose path prefixes `path` most closely (else the root).
int Replay::unit_of(const std::string& path) const { return static_cast<int>(innermost_unit(in_.units, path)); }

// Each layer to its unit (unit_of); a unit no layer falls in gets a layer of no activations of its
// own, so that its parameters still come and go.
void Replay::map_layers() {
  std::vector<bool> has(in_.units.size(), false);
  for (const auto& l : layers_) has[static_cast<size_t>(unit_of(l.path))] = true;
  for (size_t u = 0; u < in_.units.size(); ++u)
    if (!has[u]) layers_.push_back(LayerActivations{in_.units[u].fqn, 0, 0, 0, 0});
  first_layer_.assign(units_.size(), layers_.size());
  last_layer_.assign(units_.size(), 0);
  // The root's forward begins first (ShardingEngine::forward), whatever its first layer is (after
  // the embedding's unit, gpt's is the final norm); the others as their first layers come.
  forward_order_.push_back(0);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int u = unit_of(layers_[l].path);
    layer_unit_.push_back(u);
    if (u != 0 && first_layer_[static_cast<size_t>(u)] == layers_.size()) forward_order_.push_back(u);
    first_layer_[static_cast<size_t>(u)] = std::min(first_layer_[static_cast<size_t>(u)], l);
    last_layer_[static_cast<size_t>(u)] = l;
  }
}

// Each trainable parameter's gradient to the layer of its unit whose path prefixes its name most
// closely; else to the unit's last layer, whose backward runs first.
void Replay::map_gradients() {
  layer_grad_elements_.assign(layers_.size(), 0);
  layer_grad_bytes_.assign(layers_.size(), 0);
  for (size_t u = 0; u < in_.units.size(); ++u)
    for (const auto& [name, elements] : in_.units[u].params) {
      size_t best = last_layer_[u];
      size_t best_len = 0;
      for (size_t l = 0; l < layers_.size(); ++l)
        if (layer_unit_[l] == static_cast<int>(u) && within_unit(layers_[l].path, name) &&
            layers_[l].path.size() >= best_len) {
          best = l;
          best_len = layers_[l].path.size();
        }
      layer_grad_elements_[best] += elements;
      layer_grad_bytes_[best] += elements * element_bytes(in_.units[u].dtypes.compute);
    }
}

// Each layer's cost by its path; a cost whose path no layer has goes to the first layer of the
// unit it falls in (a model that states its work but not its activations: one layer per unit).
std::vector<LayerCost> Replay::layer_costs() const {
  std::vector<LayerCost> out(layers_.size());
  if (!in_.costs) return out;
  std::map<std::string, size_t> by_path;
  for (size_t l = 0; l < layers_.size(); ++l) by_path.emplace(layers_[l].path, l);
  for (const LayerCost& c : in_.costs->layers) {
    auto it = by_path.find(c.path);
    LayerCost& to = out[it != by_path.end() ? it->second : first_layer_[static_cast<size_t>(unit_of(c.path))]];
    to.forward_matmul += c.forward_matmul;
    to.forward_memory += c.forward_memory;
    to.backward_matmul += c.backward_matmul;
    to.backward_memory += c.backward_memory;
  }
  return out;
}

// The all-gather's input: the shard's cast, or for a backward after a forward under a
// post-forward group, the part it kept (already counted).
int64_t Replay::gather_input(int u) const {
  return kept_[static_cast<size_t>(u)] ? 0 : units_[static_cast<size_t>(u)].gather_in;
}

void Replay::unshard(int u, bool forward) {
  const size_t i = static_cast<size_t>(u);
  const ReplayedUnit& b = units_[i];
  if (gathered_[i] || b.gathered == 0) return;
  const int64_t input = gather_input(u);
  if (!prefetched_[i]) {
    if (sharded()) trace("gather", u);
    ledger_.add(input + b.gather_out);
    timeline_.issue_gather(u);
  }
  timeline_.gathered(u);
  const bool from_kept = kept_[i];
  if (forward && !from_kept && b.post_forward > 0) {  // ParamGroup::keep_post_forward
    ledger_.add(b.post_forward);
    kept_[i] = true;
  }
  ledger_.add(b.gathered);
  ledger_.moment("the copy-out of " + b.name + "'s all-gather");
  ledger_.sub(input + b.gather_out);
  if (from_kept) {
    ledger_.sub(b.post_forward);
    kept_[i] = false;
  }
  gathered_[i] = true;
  prefetched_[i] = false;
}

// ShardingEngine::Impl::prefetch_in, by the same rule (step_order.h): those still sharded start
// their all-gather.
void Replay::prefetch_after(int u, const std::vector<int>& order) {
  fsdpx::prefetch_after(
      order, u, in_.overlap, in_.prefetch, [&](int v) { return done_[static_cast<size_t>(v)]; },
      [&](int v) {
        const size_t i = static_cast<size_t>(v);
        if (gathered_[i] || prefetched_[i] || units_[i].gathered == 0) return;
        if (sharded()) trace("gather", v);
        ledger_.add(gather_input(v) + units_[i].gather_out);
        prefetched_[i] = true;
        timeline_.issue_gather(v);
      });
}

void Replay::forward_pass() {
  // Unit::begin_step, for every forward (each micro-batch's too): no unit is through its backward.
  for (auto* flags : {&started_, &progressed_, &done_, &loaded_}) std::fill(flags->begin(), flags->end(), false);
  activation_host_ = 0;
  std::fill(seen_.begin(), seen_.end(), 0);
  timeline_.begin_pass(true);
  unshard(0, true);
  std::vector<bool> recomputed_kept(units_.size(), false);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int u = layer_unit_[l];
    const ReplayedUnit& b = units_[static_cast<size_t>(u)];
    if (u != 0 && l == first_layer_[static_cast<size_t>(u)]) {
      unshard(u, true);
      prefetch_after(u, forward_order_);
    }
    int64_t transient = layers_[l].forward_extra;
    if (!b.recompute) {
      ledger_.add(layers_[l].saved);
    } else {
      if (!recomputed_kept[static_cast<size_t>(u)]) keep_input(u);
      recomputed_kept[static_cast<size_t>(u)] = true;
      transient += layers_[l].saved * kRecomputedLiveQuarters / 4;
    }
    ledger_.moment("the forward of " + layers_[l].path, transient);
    timeline_.layer_forward(l);
    if (u == offloading_ && l == last_layer_[static_cast<size_t>(u)] && release_after_ >= 0)
      ledger_.sub(input_of(std::exchange(release_after_, -1)));
    if (u != 0 && l == last_layer_[static_cast<size_t>(u)] && b.reshard_after_forward &&
        gathered_[static_cast<size_t>(u)]) {
      trace("free", u);
      ledger_.sub(b.gathered);
      gathered_[static_cast<size_t>(u)] = false;
    }
  }
  if (offloading_ >= 0)  // ShardingEngine::forward's end: the last copies waited for, their inputs gone
    ledger_.sub(input_of(std::exchange(offloading_, -1)));
}

// What Recompute keeps: the unit's input; offloaded, it is kept only until the next offloaded
// unit's forward has run (ShardingEngine::Impl::offload_issued), and its copy waits in host memory.
void Replay::keep_input(int u) {
  const int64_t input = layers_[first_layer_[static_cast<size_t>(u)]].input;
  ledger_.add(input);
  if (!units_[static_cast<size_t>(u)].offload) return;
  release_after_ = std::exchange(offloading_, u);
  activation_host_ += input;
}

void Replay::start_backward(int u) {
  const size_t i = static_cast<size_t>(u);
  started_[i] = true;
  progressed_[i] = done_[i] = false;
  seen_[i] = 0;
  unshard(u, false);
  // Activation offload (ShardingEngine::Impl::load_offloaded): its input comes back, and the
  // next unit's in backward order.
  for (const int v : loads_at_backward(backward_order(forward_order_), u)) {
    const size_t k = static_cast<size_t>(v);
    if (!units_[k].offload || loaded_[k]) continue;
    ledger_.add(input_of(v));
    loaded_[k] = true;
  }
  if (units_[i].recompute) {  // the forward again, with a graph: its activations, not its inputs
    for (size_t l = first_layer_[i]; l <= last_layer_[i]; ++l)
      if (layer_unit_[l] == u) {
        ledger_.add(layers_[l].saved);
        timeline_.layer_recompute(l);
      }
    ledger_.sub(layers_[first_layer_[i]].input);
  }
  if (units_[i].grad_elements == 0) progress(u);
}

void Replay::progress(int u) {
  progressed_[static_cast<size_t>(u)] = true;
  finish_in_flight();
  prefetch_after(u, backward_order(forward_order_));
}

void Replay::layer_backward(size_t l, bool sync) {
  const int u = layer_unit_[l];
  const size_t i = static_cast<size_t>(u);
  if (!started_[i]) start_backward(u);
  const int64_t grads = layer_grad_bytes_[l];
  // Unsynchronised micro-batches keep the unsharded gradients; the next one adds into them.
  const bool fresh = !grads_held_[i];
  ledger_.moment("the backward of " + layers_[l].path + " (in " + units_[i].name + ")",
                 layers_[l].backward_peak - layers_[l].saved + grads);
  if (fresh) ledger_.add(grads);
  ledger_.sub(layers_[l].saved);
  timeline_.layer_backward(l);
  seen_[i] += layer_grad_elements_[l];
  if (!progressed_[i] && seen_[i] >= progress_after(units_[i].grad_elements)) progress(u);
  if (u != 0 && l == first_layer_[i]) post_backward(u, sync);
  (void)sync;
}

void Replay::post_backward(int u, bool sync) {
  const size_t i = static_cast<size_t>(u);
  if (!progressed_[i]) progress(u);
  done_[i] = true;
  if (gathered_[i]) {
    trace("free", u);
    ledger_.sub(units_[i].gathered);
    gathered_[i] = false;
  }
  grads_held_[i] = true;
  if (sync) reduce(u);
}

void Replay::reduce(int u) {
  const size_t i = static_cast<size_t>(u);
  const ReplayedUnit& b = units_[i];
  finish_in_flight();
  trace("reduce", u);
  timeline_.issue_reduce(u);
  ledger_.add(b.packed);
  ledger_.moment("packing " + b.name + "'s gradients");
  int64_t grads = 0;
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layer_unit_[l] == u) grads += layer_grad_bytes_[l];
  ledger_.sub(grads);
  grads_held_[i] = false;
  if (!shard_held_[i]) ledger_.add(b.grad_shard);  // ParamGroup::hold_gradients, after the packing
  shard_held_[i] = true;
  if (b.exchange > 0) {  // deterministic: the rows for each world rank, then the packing goes
    ledger_.add(b.exchange);
    ledger_.sub(b.packed);
  }
  ledger_.add(b.received + b.reduce_out);
  ledger_.moment("the reduction of " + b.name);
  in_flight_ = u;  // finished when the next unit progresses, or the backward ends
  in_flight_bytes_ = (b.exchange > 0 ? b.exchange : b.packed) + b.received + b.reduce_out;
  if (in_.layout.shard_group_size == 1 && !in_.deterministic && !averages_on_device(in_)) {
    ledger_.sub(in_flight_bytes_);  // copied into the gradient shard at once; averaged there in place
    in_flight_bytes_ = 0;
  }
}

// ShardingEngine::Impl::finish_in_flight_reduce: hybrid, the reduced shard's all-reduce across
// replicas starts (in place: no bytes), after the one in flight is finished.
void Replay::finish_in_flight() {
  if (in_flight_ < 0) return;
  const int u = std::exchange(in_flight_, -1);
  ledger_.sub(in_flight_bytes_);
  in_flight_bytes_ = 0;
  trace("reduced", u);
  timeline_.reduced(u);
  if (in_.layout.shard_group_size == 1 || in_.layout.replicate_group_size == 1 || in_.deterministic)
    return gradients_final(u);
  finish_replicate();
  replicating_ = u;
  timeline_.issue_replicate(u);
}

void Replay::finish_replicate() {
  if (replicating_ < 0) return;
  timeline_.replicated(replicating_);
  gradients_final(std::exchange(replicating_, -1));
}

void Replay::gradients_final(int u) {
  const size_t i = static_cast<size_t>(u);
  if (!in_.step_in_backward) return;
  trace("step", u);
  timeline_.unit_step(u);
  ledger_.moment("the optimizer step of " + units_[i].name + " (inside backward)",
                 widened_gradient(in_.units[i], in_));
  if (shard_held_[i]) ledger_.sub(units_[i].grad_shard);
  shard_held_[i] = false;
}

void Replay::backward_pass(bool sync) {
  timeline_.begin_pass(false);
  start_backward(0);  // the hook on the root's output runs first
  for (size_t l = layers_.size(); l-- > 0;) layer_backward(l, sync);
  post_backward(0, sync);  // finish_backward: the root last
  finish_in_flight();
  finish_replicate();
}

StepMemory Replay::run() {
  StepMemory m;
  for (size_t u = 0; u < units_.size(); ++u) {
    m.param_bytes += in_.units[u].shard_numel * element_bytes(in_.units[u].dtypes.storage);
    m.grad_bytes += units_[u].grad_shard;
  }
  m.optimizer_bytes = in_.optimizer_bytes;
  for (const auto& l : in_.layers) m.activation_bytes += l.saved;
  if (in_.offload) {  // in host memory: the device's ledger holds none of it
    m.host_bytes = m.param_bytes + m.grad_bytes + m.optimizer_bytes;
    for (auto& b : units_) b.grad_shard = 0;
  } else {
    ledger_.add(m.param_bytes + m.optimizer_bytes);
  }
  if (in_.deterministic && !in_.offload) {  // zero_grad holds every gradient shard from the start
    ledger_.add(m.grad_bytes);
    std::fill(shard_held_.begin(), shard_held_.end(), true);
  }
  // Unsynchronised micro-batches first (their unsharded gradients stay), then the last one. Every
  // unsynchronised pass after the first holds the same bytes as the first, so one of them and the
  // synchronised one cover every moment of the step.
  constexpr int64_t kDistinctPasses = 2;
  const int64_t passes = in_.deterministic ? 1 : std::min<int64_t>(in_.forwards, kDistinctPasses);
  for (int64_t k = 0; k < passes; ++k) {
    const bool sync = k == passes - 1;
    ledger_.restart();
    forward_pass();
    m.forward_peak = std::max(m.forward_peak, ledger_.peak());
    const std::string forward_where = ledger_.where();
    ledger_.restart();
    m.activation_host_bytes = activation_host_;
    backward_pass(sync);
    // A pass stands for itself, the first of two for every unsynchronised micro-batch, a
    // deterministic one for every sample.
    timeline_.end_pass(in_.deterministic ? in_.forwards : sync ? 1 : in_.forwards - 1);
    m.backward_peak = std::max(m.backward_peak, ledger_.peak());
    if (m.backward_peak >= m.forward_peak) m.peak_where = "backward: " + ledger_.where();
    else m.peak_where = "forward: " + forward_where;
  }
  ledger_.restart();
  // Clipping's double copy of one chunk of a gradient shard (kGradNormChunk).
  int64_t chunk = 0;
  for (const auto& u : in_.units) chunk = std::max(chunk, std::min<int64_t>(u.shard_numel, kGradNormChunk));
  int64_t widened = 0;
  for (const auto& u : in_.units) widened = std::max(widened, widened_gradient(u, in_));
  const int64_t clip_copy = in_.clip_grad_norm && !in_.offload ? chunk * int64_t{sizeof(double)} : 0;
  ledger_.moment("the optimizer step", std::max(clip_copy, widened));
  timeline_.optimizer_step(in_.clip_grad_norm, in_.step_in_backward);
  m.time = timeline_.result();
  m.optimizer_peak = ledger_.peak();
  m.peak = std::max({m.forward_peak, m.backward_peak, m.optimizer_peak});
  if (m.peak == m.optimizer_peak && m.optimizer_peak > std::max(m.forward_peak, m.backward_peak))
    m.peak_where = "the optimizer step";
  return m;
}

}  // namespace

StepMemory predict_step_memory(const StepMemoryInput& input) { return Replay(input).run(); }

}  // namespace fsdpx
