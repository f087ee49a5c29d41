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
#include <optional>
#include <sstream>
#include <iterator>

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
  int SimProfile::*count = nullptr;  // a whole number instead
};
const ProfileKey kProfileKeys[] = {
    {"fp32_tflops", nullptr, 0, false},
    {"tf32_tflops", nullptr, 1, false},
    {"bf16_tflops", nullptr, 2, false},
    {"fp16_tflops", nullptr, 3, false},
    {"memory_gbps", &SimProfile::memory_gbps, -1, false},
    {"launch_us", &SimProfile::launch_us, -1, true},
    {"fill_outputs", &SimProfile::fill_outputs, -1, true},
    {"pcie_gbps", &SimProfile::pcie_gbps, -1, false},
    {"pcie_latency_us", &SimProfile::pcie_latency_us, -1, true},
    {"nvlink_gbps", &SimProfile::nvlink_gbps, -1, false},
    {"nvlink_latency_us", &SimProfile::nvlink_latency_us, -1, true},
    {"nic_gbps", &SimProfile::nic_gbps, -1, false},
    {"nic_latency_us", &SimProfile::nic_latency_us, -1, true},
    {"gpus_per_node", nullptr, -1, false, &SimProfile::gpus_per_node},
    {"nics_per_node", nullptr, -1, false, &SimProfile::nics_per_node},
    {"fabric_oversubscription", &SimProfile::fabric_oversubscription, -1, false},
};
// Keys a profile may leave out without 'base' (their defaults suit one GPU or none).
bool optional_key(const std::string& key) { return key == "fill_outputs" || key == "fabric_oversubscription"; }

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

// "0,1 2,3 ...": per NIC, the GPUs of a node it serves; gives each GPU its NIC.
std::vector<int> parse_affinity(const std::string& path, int line, const std::vector<std::string>& fields) {
  std::vector<int> nic_of;  // grows to the highest GPU listed
  for (std::size_t nic = 1; nic < fields.size(); ++nic) {
    std::istringstream in(fields[nic]);
    bool any = false;
    for (std::string g; std::getline(in, g, ',');) {
      char* end = nullptr;
      const long v = std::strtol(g.c_str(), &end, 10);
      if (g.empty() || *end != '\0' || v < 0 || v > 1023)
        sim_file_error(path, line, "nic_affinity: NIC " + std::to_string(nic - 1) + " lists '" + g +
                                       "', not a GPU index of the node");
      const auto gpu = static_cast<std::size_t>(v);
      if (nic_of.size() <= gpu) nic_of.resize(gpu + 1, -1);
      if (nic_of[gpu] >= 0)
        sim_file_error(path, line, "nic_affinity: GPU " + g + " is served by NIC " + std::to_string(nic_of[gpu]) +
                                       " and NIC " + std::to_string(nic - 1) + " (one NIC per GPU)");
      nic_of[gpu] = static_cast<int>(nic - 1);
      any = true;
    }
    if (!any) sim_file_error(path, line, "nic_affinity: NIC " + std::to_string(nic - 1) + " serves no GPU");
  }
  return nic_of;
}

// The node's shape must hold together: every GPU with a NIC.
void check_node(const std::string& path, int line, const SimProfile& p) {
  auto where = [&](const std::string& what) { sim_file_error(path, line, what); };
  if (p.gpus_per_node <= 0 || p.nics_per_node <= 0) where("gpus_per_node and nics_per_node must be positive");
  if (p.nic_of_gpu.empty()) {
    if (p.nics_per_node > p.gpus_per_node)
      where(std::to_string(p.nics_per_node) + " NICs per node for " + std::to_string(p.gpus_per_node) +
            " GPUs: give 'nic_affinity' (which GPUs each NIC serves)");
    return;
  }
  if (static_cast<int>(p.nic_of_gpu.size()) != p.gpus_per_node)
    where("nic_affinity lists GPUs 0-" + std::to_string(p.nic_of_gpu.size() - 1) + " for " +
          std::to_string(p.gpus_per_node) + " GPUs per node");
  for (std::size_t g = 0; g < p.nic_of_gpu.size(); ++g) {
    if (p.nic_of_gpu[g] < 0) where("nic_affinity gives GPU " + std::to_string(g) + " no NIC");
    if (p.nic_of_gpu[g] >= p.nics_per_node)
      where("nic_affinity names NIC " + std::to_string(p.nic_of_gpu[g]) + " of " + std::to_string(p.nics_per_node) +
            " NICs per node");
  }
}

SimProfile parse_profile(const std::string& path, const std::vector<std::string>& lines) {
  SimProfile p;
  std::map<std::string, int> seen;  // key -> line
  bool based = false;
  int affinity_line = 0, last_line = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + 1;
    const std::vector<std::string> f = sim_fields(lines[i]);
    if (f.empty()) continue;
    last_line = line;
    if (f[0] != "nic_affinity" && f.size() != 2)
      sim_file_error(path, line, "want 'key value', got " + std::to_string(f.size()) + " fields");
    if (auto [it, fresh] = seen.emplace(f[0], line); !fresh)
      sim_file_error(path, line, "'" + f[0] + "' given twice (first on line " + std::to_string(it->second) + ")");
    if (f[0] == "base") {
      if (seen.size() > 1) sim_file_error(path, line, "'base' must come before every other key");
      std::optional<SimProfile> base = builtin_profile(f[1]);
      if (!base) sim_file_error(path, line, "'base' takes a built-in profile (dgx-h100, dgx-h200, dgx-a100), not '" + f[1] + "'");
      p = *base;
      p.name.clear();
      based = true;
      continue;
    }
    if (f[0] == "name") {
      p.name = f[1];
      continue;
    }
    if (f[0] == "nic_affinity") {
      if (f.size() < 2) sim_file_error(path, line, "'nic_affinity' wants, per NIC, the GPUs it serves (0,1 2,3 ...)");
      p.nic_of_gpu = parse_affinity(path, line, f);
      affinity_line = line;
      continue;
    }
    const ProfileKey* k = std::find_if(std::begin(kProfileKeys), std::end(kProfileKeys),
                                       [&](const ProfileKey& pk) { return f[0] == pk.key; });
    if (k == std::end(kProfileKeys)) {
      std::string known = "base, name, nic_affinity";
      for (const ProfileKey& pk : kProfileKeys) known += std::string(", ") + pk.key;
      sim_file_error(path, line, "unknown key '" + f[0] + "' (known: " + known + ")");
    }
    const double v = sim_number(path, line, f[0], f[1], k->zero_ok);
    if (k->count) {
      if (v != std::floor(v) || v > 4096)
        sim_file_error(path, line, "'" + f[0] + "' takes a whole number up to 4096, not '" + f[1] + "'");
      p.*(k->count) = static_cast<int>(v);
    } else if (k->rate >= 0) {
      p.tflops[k->rate] = v;
    } else {
      p.*(k->field) = v;
    }
    if (f[0] == "fabric_oversubscription" && v < 1)
      sim_file_error(path, line, "'fabric_oversubscription' is at least 1 (1: full bisection), not '" + f[1] + "'");
  }
  if (!based)
    for (const ProfileKey& pk : kProfileKeys)
      if (!seen.count(pk.key) && !optional_key(pk.key))
        sim_file_error(path, 0,
                       std::string("no '") + pk.key + "' line (give every key, or start from 'base dgx-h100')");
  // A node changed without its affinity: the base's no longer fits.
  if (based && !affinity_line && (seen.count("gpus_per_node") || seen.count("nics_per_node"))) p.nic_of_gpu.clear();
  check_node(path, affinity_line ? affinity_line
                                 : seen.count("nics_per_node") ? seen["nics_per_node"]
                                 : seen.count("gpus_per_node") ? seen["gpus_per_node"] : last_line,
             p);
  if (p.name.empty()) p.name = path;
  return p;
}

// Resolves a profile named in a table: a built-in name or a file (relative to the table's folder).
SimProfile profile_named(const std::string& spec, const std::string& relative_to) {
  if (std::optional<SimProfile> b = builtin_profile(spec)) return *b;
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

// The sources of every figure: docs/design/simulated-gpus.md.
std::optional<SimProfile> builtin_profile(const std::string& name) {
  SimProfile p;
  p.name = name;
  p.launch_us = 4;
  p.pcie_latency_us = 5;
  p.nvlink_latency_us = 2;
  p.nic_latency_us = 5;
  p.gpus_per_node = 8;
  p.nics_per_node = 8;
  p.fabric_oversubscription = 1;
  auto rates = [&p](double fp32, double tf32, double half) {
    p.tflops[static_cast<int>(Math::fp32)] = fp32;
    p.tflops[static_cast<int>(Math::tf32)] = tf32;
    p.tflops[static_cast<int>(Math::bf16)] = half;
    p.tflops[static_cast<int>(Math::fp16)] = half;
  };
  if (name == "dgx-h100" || name == "dgx-h200") {
    rates(51, 378, 790);
    p.memory_gbps = name == "dgx-h200" ? 4300 : 3000;
    p.fill_outputs = 7.0e5;
    p.pcie_gbps = 50;
    p.nvlink_gbps = 450;
    p.nic_gbps = 50;
    return p;
  }
  if (name == "dgx-a100") {
    // The A100 SXM datasheet's rates at the fractions the H100 figures reach of theirs.
    rates(14.8, 119, 250);
    p.memory_gbps = 1835;
    p.fill_outputs = 7.0e5 * 108 / 132;
    p.pcie_gbps = 25;
    p.nvlink_gbps = 300;
    p.nic_gbps = 25;
    return p;
  }
  return std::nullopt;
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
  // A kernel whose outputs cannot fill the GPU's SMs runs below its peak:
  // efficiency outputs / (outputs + fill_outputs).
  const double fill = cost.parallel > 0 && profile.fill_outputs > 0
                          ? cost.parallel / (cost.parallel + profile.fill_outputs)
                          : 1.0;
  const double compute = cost.flops / (profile.tflops[static_cast<int>(cost.math)] * 1e12 * fill);
  const double memory = cost.bytes / (profile.memory_gbps * 1e9);
  return profile.launch_us * 1e-6 + std::max(compute, memory);
}

int SimModel::nic_of(int gpu) const noexcept {
  const int local = gpu % per_node;
  const int k = profile.nics_per_node;
  int nic;
  if (!profile.nic_of_gpu.empty() && per_node == profile.gpus_per_node) nic = profile.nic_of_gpu[static_cast<std::size_t>(local)];
  else if (k >= per_node) nic = local;  // a NIC each
  else nic = local * k / per_node;      // spread evenly
  return node_of(gpu) * k + nic;
}

std::int64_t SimLink::first_free(std::int64_t from, std::int64_t length) const {
  std::int64_t t = std::max(from, floor);
  auto it = busy.upper_bound(t);
  if (it != busy.begin() && std::prev(it)->second > t) t = std::prev(it)->second;
  for (; it != busy.end() && it->first < t + length; ++it) t = std::max(t, it->second);
  return t;
}

void SimLink::hold(std::int64_t start, std::int64_t length) {
  if (length <= 0) return;
  std::int64_t end = start + length;
  auto it = busy.lower_bound(start);
  // Merge with a neighbour that touches it, so that back-to-back copies keep the map short.
  if (it != busy.begin() && std::prev(it)->second == start) {
    --it;
    start = it->first;
    it = busy.erase(it);
  }
  if (it != busy.end() && it->first == end) {
    end = it->second;
    busy.erase(it);
  }
  busy.emplace(start, end);
  // Forget the oldest intervals past a bound: a copy may no longer start before them.
  constexpr std::size_t kKeep = 4096;
  while (busy.size() > kKeep) {
    floor = std::max(floor, busy.begin()->second);
    busy.erase(busy.begin());
  }
}

std::shared_ptr<SimModel> make_sim_model(const SimModelOptions& options, int gpus) {
  if (options.gpus_per_node < 0)
    throw InvalidArgument("weft: sim model gpus_per_node " + std::to_string(options.gpus_per_node) +
                          " is negative (0: the profile's)");
  auto m = std::make_shared<SimModel>();
  m->options = options;
  m->gpus = gpus;
  if (std::optional<SimProfile> b = builtin_profile(options.model)) {
    m->profile = *b;
  } else {
    std::ifstream probe(options.model);
    if (!probe)
      throw InvalidArgument("weft: sim model '" + options.model +
                            "' is neither a built-in profile (dgx-h100, dgx-h200, dgx-a100) nor a readable profile or "
                            "cost-table file");
    probe.close();
    const std::vector<std::string> lines = read_lines(options.model);
    if (is_table(lines)) {
      std::string profile = "dgx-h100";
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
  m->per_node = options.gpus_per_node > 0 ? options.gpus_per_node : m->profile.gpus_per_node;
  const int nodes = (gpus + m->per_node - 1) / m->per_node;
  const auto n = static_cast<std::size_t>(gpus);
  const auto nics = static_cast<std::size_t>(std::max(nodes, 1) * m->profile.nics_per_node);
  m->h2d = std::vector<SimLink>(n);
  m->d2h = std::vector<SimLink>(n);
  m->nvlink_out = std::vector<SimLink>(n);
  m->nvlink_in = std::vector<SimLink>(n);
  m->nic_out = std::vector<SimLink>(nics);
  m->nic_in = std::vector<SimLink>(nics);
  m->compute = std::vector<SimLink>(n);
  return m;
}

}  // namespace detail
}  // namespace weft::gpu
