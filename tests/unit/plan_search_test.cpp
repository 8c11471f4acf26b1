// fsdpx-train --plan-search (docs/planning.md): the compositions a configuration leaves open,
// planned as --dry-run plans them, kept where they fit, ranked by predicted time. On a cluster
// file, so that the figures do not depend on this machine's probes.
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_paths.h"

using namespace fsdpx::test;
using json = nlohmann::json;

namespace {

std::string cluster(const char* name) { return (source_dir() / "configs/clusters" / name).string(); }

// gpt tiny on 4 ranks of one H100 node: 5 shardings (3, hybrid 2, cpu_offload) x 4 unit choices
// x 2 placements of the optimizer x 4 micro-batches of 8 samples, the precision given.
const std::string kSearch =
    " --plan-search --model.name gpt --model.size tiny --data.seq 32 --world-size 4 --rank 0 "
    "--local-world-size 4 --num-nodes 1 --device cuda --precision.name bf16_mixed";

}  // namespace

// Every open dimension is searched and a given one is not; every composition is planned or
// accounted for; the fastest comes first; and the first's command line, planned by --dry-run,
// predicts the same step and peak to the bit.
TEST(PlanSearch, PlansEveryOpenCompositionAndTheFastestFirst) {
  TempDir out, again;
  auto r = run_command(train() + kSearch + " --cluster " + cluster("h100.json") + " --out " + out.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("  fixed      precision (command line --precision.name)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  searched   sharding: full_shard | shard_grad_op | no_shard | hybrid_shard 2 | cpu_offload"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the fastest 10, as command lines:"), std::string::npos) << r.out;
  const json s = read_json(out.path() / "search.json");
  EXPECT_EQ(s["compositions"].get<int>(), 5 * 4 * 2 * 4);
  EXPECT_EQ(s["planned"].get<int>() + s["pruned"].get<int>(), s["compositions"].get<int>());
  EXPECT_EQ(s["fitting"].size() + s["too_big"].get<size_t>() + s["refused"].get<size_t>(), s["planned"].get<size_t>());
  ASSERT_GT(s["fitting"].size(), 100u);
  std::set<std::string> labels;
  for (size_t i = 0; i < s["fitting"].size(); ++i) {
    const json& f = s["fitting"][i];
    EXPECT_GT(f["step_s"].get<double>(), 0);
    if (i > 0) {
      EXPECT_LE(s["fitting"][i - 1]["step_s"].get<double>(), f["step_s"].get<double>());
    }
    EXPECT_LE(f["peak_bytes"].get<int64_t>(), s["memory_limit_bytes"].get<int64_t>());
    int precisions = 0;
    for (const auto& a : f["args"]) precisions += a.get<std::string>() == "--precision.name";
    EXPECT_EQ(precisions, 1) << f.dump();  // the given one only
    labels.insert(f["label"].get<std::string>());
  }
  EXPECT_EQ(labels.size(), s["fitting"].size());  // each composition once

  std::string first = train() + " --dry-run --out " + again.path().string();
  for (const auto& a : s["fitting"][0]["args"]) first += " " + a.get<std::string>();
  auto dry = run_command(first);
  ASSERT_EQ(dry.exit_code, 0) << dry.out << dry.err;
  const json plan = read_json(again.path() / "plan.json");
  EXPECT_EQ(plan["time"]["step_s"].get<double>(), s["fitting"][0]["step_s"].get<double>());
  EXPECT_EQ(plan["memory"]["peak_bytes"].get<int64_t>(), s["fitting"][0]["peak_bytes"].get<int64_t>());
}

// A composition is kept only where its peak fits 90% of the accelerator; a larger micro-batch of
// one that does not fit is not planned; when none fits, the search says so and exits 1.
TEST(PlanSearch, KeepsWhatFitsTheAcceleratorAndSaysWhenNothingDoes) {
  TempDir files, out;
  json h = read_json(cluster("h100.json"));
  h["memory_gib"] = 0.03;  // 30.72 MiB: gpt small's fp32 compositions at large micro-batches do not fit
  std::ofstream(files.path() / "small.json") << h.dump();
  const std::string small =
      " --plan-search --model.name gpt --model.size small --world-size 2 --rank 0 "
      "--local-world-size 2 --num-nodes 1 --device cuda --cluster ";
  auto r = run_command(train() + small + (files.path() / "small.json").string() + " --out " + out.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json s = read_json(out.path() / "search.json");
  EXPECT_GT(s["too_big"].get<int>(), 0) << r.out;
  EXPECT_GT(s["pruned"].get<int>(), 0) << r.out;
  EXPECT_GT(s["fitting"].size(), 0u) << r.out;
  const auto accelerator = static_cast<int64_t>(0.03 * (1 << 30));
  EXPECT_EQ(s["memory_limit_bytes"].get<int64_t>(), static_cast<int64_t>(0.9 * static_cast<double>(accelerator)));
  for (const auto& f : s["fitting"]) EXPECT_LE(f["peak_bytes"].get<int64_t>(), s["memory_limit_bytes"].get<int64_t>());

  h["memory_gib"] = 0.001;
  std::ofstream(files.path() / "tiny.json") << h.dump();
  auto none = run_command(train() + small + (files.path() / "tiny.json").string() + " --precision.name fp32");
  EXPECT_EQ(none.exit_code, 1) << none.out << none.err;
  EXPECT_NE(none.out.find("plan search: none of 128 compositions fits in 90% of the cluster's 1.02 MiB per "
                          "accelerator (32 planned, 32 too big, 0 refused); the smallest peak planned is "),
            std::string::npos)
      << none.out;
}

// What the search cannot rank is refused in one line naming the way out.
TEST(PlanSearch, RefusesWhatItCannotRank) {
  auto gpu = run_command(train() + kSearch);
  EXPECT_NE(gpu.exit_code, 0);
  EXPECT_NE(gpu.err.find("--plan-search ranks compositions by their predicted time, and this configuration's is not "
                         "predicted: the run computes on cuda"),
            std::string::npos)
      << gpu.err;
  auto both = run_command(train() + kSearch + " --dry-run --cluster " + cluster("h100.json"));
  EXPECT_NE(both.err.find("--dry-run and --plan-search cannot go together"), std::string::npos) << both.err;
  auto bad = run_command(train() + kSearch + " --optimizer.lr -1 --cluster " + cluster("h100.json"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("lr"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("refused"), std::string::npos) << bad.err;  // refused once, as --dry-run refuses it
}
