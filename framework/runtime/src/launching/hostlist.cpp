// Slurm's compressed lists: hostlists ("gpu[01-04,07]") and tasks per node ("2(x3),1").
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "environment_values.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/topology_resolver.h"

namespace fsdpx {

namespace {
constexpr size_t kMaxHosts = 1000000;  // far beyond any cluster's nodes in one job
// A million names of 64 characters: "a[0-999][0-999]" with a suffix of 4,000 characters was 4 GB of
// names before the count stopped it.
constexpr size_t kMaxNameBytes = size_t{64} << 20;

Error too_many_hosts(const std::string& hostlist) {
  return Error("malformed hostlist '" + hostlist.substr(0, 200) + "': more than " + std::to_string(kMaxHosts) +
               " hosts");
}

// The numbers one bracket group of `hostlist` stands for ("01-03,07": 01, 02, 03, 07).
std::vector<std::string> bracket_numbers(const std::string& hostlist, const std::string& body) {
  std::vector<std::string> middles;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    std::string range = body.substr(start, comma - start);
    auto dash = range.find('-');
    std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(lo) || !digits(hi))
      throw Error("malformed hostlist '" + hostlist + "': '" + range + "' is not a number or a range");
    if (lo.size() > 18 || hi.size() > 18)  // std::stoll's range (found by tests/fuzz/fuzz_hostlist)
      throw Error("malformed hostlist '" + hostlist + "': '" + range + "' has numbers of more than 18 digits");
    long long a = std::stoll(lo), b = std::stoll(hi);
    if (b < a) throw Error("malformed hostlist '" + hostlist + "': range '" + range + "' runs backwards");
    if (b - a > 100000) throw Error("malformed hostlist '" + hostlist + "': range '" + range + "' is too large");
    size_t width = lo.size();
    for (long long v = a; v <= b; ++v) {
      std::string s = std::to_string(v);
      if (s.size() < width) s = std::string(width - s.size(), '0') + s;
      middles.push_back(s);
      if (middles.size() > kMaxHosts)  // "a[0-99999,0-99999,...]" in 4 KB was 51 million names
        throw too_many_hosts(hostlist);
    }
    start = comma + 1;
  }
  return middles;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  // Split at commas outside brackets.
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : hostlist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) throw Error("malformed hostlist '" + hostlist + "': unbalanced brackets");
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw Error("malformed hostlist '" + hostlist + "': unbalanced brackets");
  items.push_back(cur);

  std::vector<std::string> hosts;
  size_t bytes = 0;
  for (const auto& item : items) {
    if (item.empty()) throw Error("malformed hostlist '" + hostlist + "': empty host name");
    // Expand the first bracket group, then recurse on the rest of the name.
    auto open = item.find('[');
    if (open == std::string::npos) {
      hosts.push_back(item);
      continue;
    }
    auto close = item.find(']', open);
    const std::string prefix = item.substr(0, open), body = item.substr(open + 1, close - open - 1),
                      suffix = item.substr(close + 1);
    if (body.empty()) throw Error("malformed hostlist '" + hostlist + "': empty brackets");
    const std::vector<std::string> middles = bracket_numbers(hostlist, body);
    for (const auto& m : middles) {
      std::string name = prefix + m + suffix;
      if (name.find('[') != std::string::npos) {
        auto more = expand_hostlist(name);
        for (const auto& h : more) bytes += h.size();
        hosts.insert(hosts.end(), more.begin(), more.end());
      } else {
        bytes += name.size();
        hosts.push_back(name);
      }
      // Several bracket groups multiply: "a[0-99999]b[0-99999]" would be 10^10 names.
      if (hosts.size() > kMaxHosts) throw too_many_hosts(hostlist);
      if (bytes > kMaxNameBytes)
        throw Error("malformed hostlist '" + hostlist.substr(0, 200) + "': its names come to more than " +
                    std::to_string(kMaxNameBytes >> 20) + " MiB");
    }
  }
  return hosts;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    std::string item = spec.substr(start, comma - start);
    long long count = 0, repeat = 1;
    auto paren = item.find('(');
    try {
      if (paren == std::string::npos) {
        count = parse_integer(item, "SLURM_TASKS_PER_NODE item");
      } else {
        if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
          throw Error("");
        count = parse_integer(item.substr(0, paren), "count");
        repeat = parse_integer(item.substr(paren + 2, item.size() - paren - 3), "repeat");
      }
    } catch (const Error&) {
      throw Error("malformed SLURM_TASKS_PER_NODE '" + spec + "': '" + item +
                  "' is neither N nor N(xM)");
    }
    if (count < 1 || repeat < 1 || repeat > 100000)
      throw Error("malformed SLURM_TASKS_PER_NODE '" + spec + "': '" + item + "' has a count below 1");
    for (long long i = 0; i < repeat; ++i) out.push_back(static_cast<int>(count));
    start = comma + 1;
  }
  return out;
}

int slurm_master_port(long long job_id, long long step_id) {
  return 10000 + static_cast<int>((job_id + 7919 * std::max(0LL, step_id)) % 20000);
}

}  // namespace fsdpx
