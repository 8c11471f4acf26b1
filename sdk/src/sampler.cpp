#include "fsdpx/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <numeric>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/seeds.h"

namespace fsdpx {

GlobalBatchSampler::GlobalBatchSampler(int64_t num_samples, int64_t global_batch, int rank, int world_size,
                                       uint64_t seed, bool shuffle)
    : num_samples_(num_samples), global_batch_(global_batch), rank_(rank), world_(world_size), seed_(seed),
      shuffle_(shuffle) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error("sampler: rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  if (global_batch < 1 || global_batch % world_size != 0)
    throw Error("the global batch of " + std::to_string(global_batch) + " samples does not split evenly over " +
                std::to_string(world_size) + " ranks; use a batch size per rank (--batch-size) instead");
  if (global_batch > num_samples)
    throw Error("the global batch (" + std::to_string(global_batch) + " samples: batch size per rank x " +
                std::to_string(world_size) + " ranks) is larger than the data set (" + std::to_string(num_samples) +
                " samples); lower --batch-size or use more data");
  shuffle_epoch();
}

void GlobalBatchSampler::shuffle_epoch() {
  order_.resize(static_cast<size_t>(num_samples_));
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  // Fisher-Yates driven by a counter-based mix of (seed, epoch, i): the same on every machine.
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const uint64_t r = parameter_seed(seed_, "epoch/" + std::to_string(epoch_) + "/" + std::to_string(i));
    std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(r % static_cast<uint64_t>(i + 1))]);
  }
}

std::vector<int64_t> GlobalBatchSampler::next() {
  if (step_ >= steps_per_epoch()) {
    ++epoch_;
    step_ = 0;
    shuffle_epoch();
  }
  const int64_t per_rank = global_batch_ / world_;
  const int64_t first = step_ * global_batch_ + rank_ * per_rank;
  ++step_;
  return std::vector<int64_t>(order_.begin() + first, order_.begin() + first + per_rank);
}

std::string GlobalBatchSampler::state() const {
  return nlohmann::json{{"epoch", epoch_}, {"step", step_}}.dump();
}

void GlobalBatchSampler::restore(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    epoch_ = j.at("epoch").get<int64_t>();
    step_ = j.at("step").get<int64_t>();
  } catch (const std::exception& e) {
    throw Error("data position '" + text + "' is not {\"epoch\": E, \"step\": S}: " + e.what());
  }
  if (epoch_ < 0 || step_ < 0 || step_ > steps_per_epoch())
    throw Error("data position " + text + " is outside this data set (" + std::to_string(steps_per_epoch()) +
                " steps per epoch)");
  shuffle_epoch();
}

SplitSamples::SplitSamples(int64_t num_samples, double holdout, uint64_t split_seed, std::string source)
    : source_(std::move(source)) {
  order_.resize(static_cast<size_t>(std::max<int64_t>(num_samples, 0)));
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(split_seed);
  for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i)
    std::swap(order_[static_cast<size_t>(i)], order_[rng() % static_cast<uint64_t>(i + 1)]);
  training_ = static_cast<int64_t>(order_.size()) -
              static_cast<int64_t>(std::floor(static_cast<double>(order_.size()) * holdout));
}

void SplitSamples::open(int64_t batch_size, int rank, int world_size, uint64_t seed) {
  sampler_ = std::make_unique<GlobalBatchSampler>(training_, batch_size * world_size, rank, world_size, seed);
}

std::vector<int64_t> SplitSamples::next() {
  if (!sampler_) throw Error(source_ + ": next() before open()");
  std::vector<int64_t> idx;
  for (int64_t i : sampler_->next()) idx.push_back(order_[static_cast<size_t>(i)]);
  return idx;
}

std::string SplitSamples::state() const { return sampler_ ? sampler_->state() : "{}"; }

void SplitSamples::restore(const std::string& state) {
  if (!sampler_) throw Error(source_ + ": restore() before open()");
  sampler_->restore(state);
}

std::vector<int64_t> SplitSamples::heldout(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > held_out())
    throw Error(source_ + ": held-out samples " + std::to_string(first) + "+" + std::to_string(count) +
                " outside 0.." + std::to_string(held_out()));
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < count; ++i) idx.push_back(order_[static_cast<size_t>(training_ + first + i)]);
  return idx;
}

}  // namespace fsdpx
