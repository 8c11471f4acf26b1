#include "evaluator.h"

#include <algorithm>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "engine_comms.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/framework/runtime/every_rank.h"

using json = nlohmann::json;

namespace fsdpx {
namespace {

json eval_record(int64_t step, double loss_sum, double correct, double samples, bool has_accuracy) {
  json e{{"step", step}, {"eval_loss", loss_sum / samples}, {"eval_samples", static_cast<int64_t>(samples)}};
  if (has_accuracy) e["eval_accuracy"] = correct / samples;
  return e;
}

// One forward of `evaluable` on `batch` under the engine (the units' gathers are collective).
EvalSums forward(ShardingEngine& engine, Evaluable& evaluable, const Batch& batch) {
  EvalSums r;
  engine.forward([&] {
    r = evaluable.evaluate(batch);
    return at::zeros({}, at::kFloat);
  });
  return r;
}

}  // namespace

Evaluator::Evaluator(ShardingEngine& engine, Model& model, DataSource& data, Communicator& world, c10::Device device,
                     int64_t batch_size, bool deterministic)
    : engine_(engine),
      evaluable_(dynamic_cast<Evaluable*>(&model)),
      heldout_(dynamic_cast<HeldOutData*>(&data)),
      world_(world),
      device_(device),
      batch_size_(batch_size),
      deterministic_(deterministic) {}

json Evaluator::evaluate(int64_t step) {
  if (!evaluable_ || !heldout_ || heldout_->num_heldout() == 0) return json();
  at::NoGradGuard no_grad;
  return deterministic_ ? in_sample_order(step) : in_chunks(step);
}

json Evaluator::in_chunks(int64_t step) {
  const int rank = world_.rank(), n_ranks = world_.size();
  const int64_t n = heldout_->num_heldout();
  const int64_t per_rank = (n + n_ranks - 1) / n_ranks;
  const int64_t chunk = std::max<int64_t>(1, batch_size_ * 4);
  double sums[3] = {0, 0, 0};
  bool has_accuracy = true;
  for (int64_t off = 0; off < per_rank; off += chunk) {
    const int64_t first = std::min(n, rank * per_rank + off);
    const int64_t last = std::min({n, rank * per_rank + per_rank, rank * per_rank + off + chunk});
    // A rank whose share is used up runs one sample and does not count it.
    const bool empty = last <= first;
    EvalSums r = forward(engine_, *evaluable_,
                         on_device(heldout_->heldout(empty ? 0 : first, empty ? 1 : last - first), device_));
    if (empty) r = EvalSums{0, r.correct >= 0 ? 0.0 : -1.0, 0};
    sums[0] += r.loss_sum;
    sums[1] += std::max(0.0, r.correct);
    sums[2] += static_cast<double>(r.samples);
    has_accuracy = has_accuracy && r.correct >= 0;
  }
  at::Tensor t = at::empty({4}, at::kDouble);
  t[0] = sums[0];
  t[1] = sums[1];
  t[2] = sums[2];
  t[3] = has_accuracy ? 0.0 : 1.0;
  world_.all_reduce(t, ReduceOp::Sum).wait();
  return eval_record(step, t[0].item<double>(), t[1].item<double>(), t[2].item<double>(), t[3].item<double>() == 0);
}

json Evaluator::in_sample_order(int64_t step) {
  const int rank = world_.rank(), W = world_.size();
  const int64_t n = heldout_->num_heldout(), per_rank = (n + W - 1) / W;
  std::vector<double> mine(static_cast<size_t>(per_rank * 3), 0.0);  // per sample: loss sum, correct, samples
  for (int64_t j = 0; j < per_rank; ++j) {
    const int64_t i = j * W + rank;
    // Past the end: a forward all ranks run, not counted.
    const EvalSums r = forward(engine_, *evaluable_, on_device(heldout_->heldout(i < n ? i : 0, 1), device_));
    if (i >= n) continue;
    mine[static_cast<size_t>(3 * j)] = r.loss_sum;
    mine[static_cast<size_t>(3 * j + 1)] = r.correct;
    mine[static_cast<size_t>(3 * j + 2)] = static_cast<double>(r.samples);
  }
  const auto all = from_every_rank(world_, mine);
  double sums[3] = {0, 0, 0};
  bool has_accuracy = true;
  for (int64_t i = 0; i < n; ++i) {
    const double* f = all[static_cast<size_t>(i % W)].data() + (i / W) * 3;
    sums[0] += f[0];
    sums[1] += std::max(0.0, f[1]);
    sums[2] += f[2];
    has_accuracy = has_accuracy && f[1] >= 0;
  }
  return eval_record(step, sums[0], sums[1], sums[2], has_accuracy);
}

}  // namespace fsdpx
