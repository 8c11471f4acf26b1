// A cluster file's accelerators for the time model (hardware.h); its fields are docs/planning.md's.
#include <algorithm>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "hardware.h"

namespace fsdpx {
namespace {

using json = nlohmann::json;

// A positive number at `key` of `j`, or an error naming the file, the field and what is wanted.
double positive(const json& j, const std::string& key, const std::string& where, const std::string& file) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number() || j[key].get<double>() <= 0)
    throw Error("the cluster file " + file + " needs " + where + key + " as a positive number" +
                (j.is_object() && j.contains(key) ? ", and it is " + j[key].dump() : ", and it has none"));
  return j[key].get<double>();
}

LinkSpeed link(const json& j, const std::string& key, double achieved, const std::string& file) {
  if (!j.contains(key) || !j[key].is_object())
    throw Error("the cluster file " + file + " needs " + key + " as an object with gbps and latency_us");
  return {positive(j[key], "gbps", key + ".", file) * 1e9 * achieved,
          positive(j[key], "latency_us", key + ".", file) * 1e-6};
}

// Each matmul at the achieved fraction of the dense peak for its dtype, or at memory bandwidth
// where its operands take longer to read and write than its flops to compute (a roofline).
class Cluster final : public Hardware {
 public:
  Cluster(const json& j, const std::string& file) {
    const json& achieved = j.contains("achieved") ? j["achieved"] : json::object();
    matmul_fraction_ = positive(achieved, "matmul", "achieved.", file);
    memory_bytes_per_s = positive(j, "memory_gbps", "", file) * 1e9 * positive(achieved, "memory", "achieved.", file);
    if (!j.contains("dense_tflops") || !j["dense_tflops"].is_object())
      throw Error("the cluster file " + file + " needs dense_tflops, e.g. {\"bf16\": 989, \"fp32\": 67}");
    for (const auto& [dtype, v] : j["dense_tflops"].items())
      tflops_[dtype] = positive(j["dense_tflops"], dtype, "dense_tflops.", file);
    for (const char* needed : {"bf16", "fp32"})
      if (!tflops_.count(needed))
        throw Error(std::string("the cluster file ") + file + " needs dense_tflops." + needed);
    float8 = tflops_.count("float8") > 0;
    node = link(j, "node_link", positive(achieved, "node_link", "achieved.", file), file);
    network = link(j, "network_link", positive(achieved, "network_link", "achieved.", file), file);
    host_bytes_per_s = positive(j, "host_link_gbps", "", file) * 1e9;
    forward_kernel_s = positive(j, "kernel_launch_us", "", file) * 1e-6;
    backward_kernel_s = 2 * forward_kernel_s;  // the autograd node's launch besides its kernel's
    accelerators_per_node = static_cast<int>(positive(j, "accelerators_per_node", "", file));
    memory_per_accelerator = static_cast<int64_t>(positive(j, "memory_gib", "", file) * static_cast<double>(1 << 30));
    what = "the cluster file " + file +
           (j.contains("name") && j["name"].is_string() ? ": " + j["name"].get<std::string>() : "");
  }

  double peak_flops(c10::ScalarType dtype) override { return tflops(dtype) * 1e12; }

  // A fused attention kernel at the matmuls' achieved rate; its backward recomputes the scores
  // and runs four products where the forward runs two: two and a half times the forward.
  double attention_seconds(const Attention& a, c10::ScalarType dtype, bool backward) override {
    return (backward ? 2.5 : 1.0) * a.flops() / (tflops(dtype) * 1e12 * matmul_fraction_);
  }

  double matmul_seconds(const Matmul& mm, c10::ScalarType dtype, MatmulPass) override {
    const double bytes = static_cast<double>(mm.batch * (mm.m * mm.k + mm.k * mm.n + mm.m * mm.n)) *
                         static_cast<double>(c10::elementSize(dtype));
    return std::max(mm.flops() / (tflops(dtype) * 1e12 * matmul_fraction_), bytes / memory_bytes_per_s);
  }

 private:
  double tflops(c10::ScalarType dtype) const {
    const std::string name = dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2 ? "float8"
                             : dtype == at::kHalf ? (tflops_.count("fp16") ? "fp16" : "bf16")
                                                  : dtype_name(dtype);
    auto it = tflops_.find(name);
    return it != tflops_.end() ? it->second : tflops_.at("fp32");
  }

  std::map<std::string, double> tflops_;
  double matmul_fraction_ = 1;
};

}  // namespace

std::unique_ptr<Hardware> read_cluster_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("--cluster " + path + ": no such file (configs/clusters/ has the shipped ones)");
  const json j = json::parse(in, nullptr, false);
  if (!j.is_object()) throw Error("--cluster " + path + " is not a JSON object; see docs/planning.md for its fields");
  return std::make_unique<Cluster>(j, path);
}

}  // namespace fsdpx
