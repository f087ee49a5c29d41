// The sim backend's cost model: the built-in H100 profile, profile and
// cost-table files, and a kernel's modeled time. The formats and the
// profile's sources: docs/design/simulated-gpus.md.
#include "sim_model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "weft/error.h"

namespace weft::gpu {

std::string_view to_string(Math math) noexcept {
  switch (math) {
    case Math::fp32: return "fp32";
    case Math::tf32: return "tf32";
    case Math::bf16: return "bf16";
    case Math::fp16: return "fp16";
  }
  return "?";
}

namespace detail {

namespace {

// Whitespace-separated fields of a line, without its '#' comment.
std::vector<std::string> sim_fields(const std::string& line) {
  std::istringstream in(line.substr(0, line.find('#')));
  std::vector<std::string> out;
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

[[noreturn]] void sim_file_error(const std::string& file, int line, const std::string& what) {
  throw InvalidArgument("weft: sim model file " + file + (line > 0 ? ":" + std::to_string(line) : std::string()) +
                        ": " + what);
}

double sim_number(const std::string& file, int line, const std::string& key, const std::string& text,
                  bool zero_ok) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < 0 || (!zero_ok && v == 0))
    sim_file_error(file, line,
                   "'" + key + "' takes a " + (zero_ok ? "non-negative" : "positive") + " number, not '" + text + "'");
  return v;
}

struct ProfileKey {
  const char* key;
  double SimProfile::*field;
  int rate;  // >= 0: tflops[rate] instead of `field`
  bool zero_ok;
};
const ProfileKey kProfileKeys[] = {
    {"fp32_tflops", nullptr, 0, false},
    {"tf32_tflops", nullptr, 1, false},
    {"bf16_tflops", nullptr, 2, false},
    {"fp16_tflops", nullptr, 3, false},
    {"memory_gbps", &SimProfile::memory_gbps, -1, false},
    {"launch_us", &SimProfile::launch_us, -1, true},
    {"pcie_gbps", &SimProfile::pcie_gbps, -1, false},
    {"pcie_latency_us", &SimProfile::pcie_latency_us, -1, true},
    {"nvlink_gbps", &SimProfile::nvlink_gbps, -1, false},
    {"nvlink_latency_us", &SimProfile::nvlink_latency_us, -1, true},
    {"nic_gbps", &SimProfile::nic_gbps, -1, false},
    {"nic_latency_us", &SimProfile::nic_latency_us, -1, true},
};

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("weft: sim model file " + path + " cannot be read");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool is_table(const std::vector<std::string>& lines) {
  for (const std::string& l : lines) {
    const std::vector<std::string> f = sim_fields(l);
    if (f.empty()) continue;
    return f.size() == 2 && f[0] == "weft-cost-table";
  }
  return false;
}

SimProfile parse_profile(const std::string& path, const std::vector<std::string>& lines) {
  SimProfile p;
  std::map<std::string, int> seen;  // key -> line
  bool based = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + 1;
    const std::vector<std::string> f = sim_fields(lines[i]);
    if (f.empty()) continue;
    if (f.size() != 2) sim_file_error(path, line, "want 'key value', got " + std::to_string(f.size()) + " fields");
    if (auto [it, fresh] = seen.emplace(f[0], line); !fresh)
      sim_file_error(path, line, "'" + f[0] + "' given twice (first on line " + std::to_string(it->second) + ")");
    if (f[0] == "base") {
      if (seen.size() > 1) sim_file_error(path, line, "'base' must come before every other key");
      if (f[1] != "h100") sim_file_error(path, line, "'base' takes a built-in profile (h100), not '" + f[1] + "'");
      const std::string name = p.name;
      p = h100_profile();
      if (!name.empty()) p.name = name;
      based = true;
      continue;
    }
    if (f[0] == "name") {
      p.name = f[1];
      continue;
    }
    const ProfileKey* k = std::find_if(std::begin(kProfileKeys), std::end(kProfileKeys),
                                       [&](const ProfileKey& pk) { return f[0] == pk.key; });
    if (k == std::end(kProfileKeys)) {
      std::string known = "base, name";
      for (const ProfileKey& pk : kProfileKeys) known += std::string(", ") + pk.key;
      sim_file_error(path, line, "unknown key '" + f[0] + "' (known: " + known + ")");
    }
    const double v = sim_number(path, line, f[0], f[1], k->zero_ok);
    if (k->rate >= 0) p.tflops[k->rate] = v;
    else p.*(k->field) = v;
  }
  if (!based)
    for (const ProfileKey& pk : kProfileKeys)
      if (!seen.count(pk.key))
        sim_file_error(path, 0,
                       std::string("no '") + pk.key + "' line (give every key, or start from 'base h100')");
  if (p.name.empty()) p.name = path;
  return p;
}

// Resolves a profile named in a table: a built-in name or a file (relative to the table's folder).
SimProfile profile_named(const std::string& spec, const std::string& relative_to) {
  if (spec == "h100") return h100_profile();
  std::string path = spec;
  if (!spec.empty() && spec[0] != '/') {
    const std::size_t slash = relative_to.rfind('/');
    if (slash != std::string::npos) path = relative_to.substr(0, slash + 1) + spec;
  }
  return read_profile_file(path);
}

CostTable parse_table(const std::string& path, const std::vector<std::string>& lines, std::string* profile,
                      int* profile_line) {
  CostTable t;
  t.file = path;
  std::map<std::string, int> seen;
  bool header = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + 1;
    const std::vector<std::string> f = sim_fields(lines[i]);
    if (f.empty()) continue;
    if (!header) {
      if (f.size() != 2 || f[0] != "weft-cost-table" || f[1] != "1")
        sim_file_error(path, line, "a cost table starts with 'weft-cost-table 1'");
      header = true;
      continue;
    }
    if (f[0] == "profile" && f.size() == 2) {
      if (*profile_line) sim_file_error(path, line, "'profile' given twice (first on line " +
                                                        std::to_string(*profile_line) + ")");
      *profile = f[1];
      *profile_line = line;
      continue;
    }
    if (f.size() < 3)
      sim_file_error(path, line, "want 'op shape microseconds' (the op's name may contain spaces), got " +
                                     std::to_string(f.size()) + " field(s)");
    std::string op = f[0];
    for (std::size_t k = 1; k + 2 < f.size(); ++k) op += " " + f[k];
    const std::string key = op + '\t' + f[f.size() - 2];
    const double us = sim_number(path, line, op + " " + f[f.size() - 2], f.back(), true);
    if (auto [it, fresh] = seen.emplace(key, line); !fresh)
      sim_file_error(path, line, "'" + op + " " + f[f.size() - 2] + "' listed twice (first on line " +
                                     std::to_string(it->second) + ")");
    t.us.emplace(key, us);
  }
  if (!header) sim_file_error(path, 0, "empty (a cost table starts with 'weft-cost-table 1')");
  return t;
}

}  // namespace

SimProfile h100_profile() {
  SimProfile p;
  p.name = "h100";
  p.tflops[static_cast<int>(Math::fp32)] = 51;
  p.tflops[static_cast<int>(Math::tf32)] = 378;
  p.tflops[static_cast<int>(Math::bf16)] = 790;
  p.tflops[static_cast<int>(Math::fp16)] = 790;
  p.memory_gbps = 3000;
  p.launch_us = 4;
  p.pcie_gbps = 25;
  p.pcie_latency_us = 5;
  p.nvlink_gbps = 450;
  p.nvlink_latency_us = 2;
  p.nic_gbps = 50;
  p.nic_latency_us = 5;
  return p;
}

SimProfile read_profile_file(const std::string& path) {
  const std::vector<std::string> lines = read_lines(path);
  if (is_table(lines))
    throw InvalidArgument("weft: sim model file " + path + " is a cost table where a profile was wanted");
  return parse_profile(path, lines);
}

double SimModel::kernel_seconds(const KernelCost& cost) {
  double seconds = -1;
  if (table) {
    std::string key;
    key.reserve(cost.op.size() + cost.shape.size() + 1);
    key.append(cost.op).append(1, '\t').append(cost.shape);
    if (auto it = table->us.find(key); it != table->us.end()) seconds = it->second * 1e-6;
    std::lock_guard lock(stats_mutex);
    ++stats.kernels;
    if (seconds >= 0) {
      ++stats.from_table;
    } else {
      ++stats.fallbacks;
      ++stats.missing[std::string(cost.op) + " " + std::string(cost.shape)];
    }
  } else {
    std::lock_guard lock(stats_mutex);
    ++stats.kernels;
  }
  if (seconds >= 0) return seconds;
  const double compute = cost.flops / (profile.tflops[static_cast<int>(cost.math)] * 1e12);
  const double memory = cost.bytes / (profile.memory_gbps * 1e9);
  return profile.launch_us * 1e-6 + std::max(compute, memory);
}

std::shared_ptr<SimModel> make_sim_model(const SimModelOptions& options, int gpus) {
  if (!(options.dilation > 0) || !std::isfinite(options.dilation))
    throw InvalidArgument("weft: sim model dilation " + std::to_string(options.dilation) + " is not positive");
  if (options.gpus_per_node < 0)
    throw InvalidArgument("weft: sim model gpus_per_node " + std::to_string(options.gpus_per_node) +
                          " is negative (0: every GPU in one node)");
  auto m = std::make_shared<SimModel>();
  m->options = options;
  m->gpus = gpus;
  if (options.model == "h100") {
    m->profile = h100_profile();
  } else {
    std::ifstream probe(options.model);
    if (!probe)
      throw InvalidArgument("weft: sim model '" + options.model +
                            "' is neither a built-in profile (h100) nor a readable profile or cost-table file");
    probe.close();
    const std::vector<std::string> lines = read_lines(options.model);
    if (is_table(lines)) {
      std::string profile = "h100";
      int profile_line = 0;
      m->table = parse_table(options.model, lines, &profile, &profile_line);
      try {
        m->profile = profile_named(profile, options.model);
      } catch (const InvalidArgument& e) {
        sim_file_error(options.model, profile_line, std::string("its fallback profile: ") + e.what());
      }
    } else {
      m->profile = parse_profile(options.model, lines);
    }
  }
  const int per_node = options.gpus_per_node > 0 ? options.gpus_per_node : std::max(gpus, 1);
  const int nodes = (gpus + per_node - 1) / per_node;
  const auto n = static_cast<std::size_t>(gpus);
  m->h2d = std::vector<SimLink>(n);
  m->d2h = std::vector<SimLink>(n);
  m->nvlink_out = std::vector<SimLink>(n);
  m->nvlink_in = std::vector<SimLink>(n);
  m->nic_out = std::vector<SimLink>(static_cast<std::size_t>(std::max(nodes, 1)));
  m->nic_in = std::vector<SimLink>(static_cast<std::size_t>(std::max(nodes, 1)));
  return m;
}

}  // namespace detail
}  // namespace weft::gpu
