// weft::optim: options, the Optimizer (state tensors and the step ops),
// learning-rate schedules and gradient-norm clipping. The kernels are
// cpu/optim.cpp and gpu/optim.cu over optim_math.h's arithmetic.
#include "weft/optim.h"

#include <charconv>
#include <cmath>
#include <numbers>
#include <utility>

#include "cpu/cpu_kernels.h"
#include "launch.h"
#include "weft/error.h"

namespace weft::optim {

using detail::describe;
using detail::launch;
using detail::OpIO;
namespace cpu = kernels::cpu;

namespace {

// Shortest round-trip text of a float ("0.001", "1e-08").
std::string num(float v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string parameter_name(const nn::Parameter& p, std::size_t index) {
  if (!p.name.empty()) return p.name;
  if (p.value.defined() && !p.value.name().empty()) return p.value.name();
  return "parameter" + std::to_string(index);
}

const char* op_name(Algorithm a) {
  switch (a) {
    case Algorithm::sgd: return "sgd_step";
    case Algorithm::adam: return "adam_step";
    case Algorithm::adamw: return "adamw_step";
  }
  return "optimizer_step";
}

}  // namespace

std::string_view to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::sgd: return "sgd";
    case Algorithm::adam: return "adam";
    case Algorithm::adamw: return "adamw";
  }
  return "?";
}

// ---- options --------------------------------------------------------------

OptimizerOptions OptimizerOptions::sgd(float lr, float momentum, float weight_decay, bool nesterov) {
  OptimizerOptions o;
  o.algorithm = Algorithm::sgd;
  o.lr = lr;
  o.momentum = momentum;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  return o;
}

OptimizerOptions OptimizerOptions::adam(float lr, float weight_decay) {
  OptimizerOptions o;
  o.algorithm = Algorithm::adam;
  o.lr = lr;
  o.weight_decay = weight_decay;
  return o;
}

OptimizerOptions OptimizerOptions::adamw(float lr, float weight_decay) {
  OptimizerOptions o;
  o.algorithm = Algorithm::adamw;
  o.lr = lr;
  o.weight_decay = weight_decay;
  return o;
}

OptimizerOptions OptimizerOptions::parse(std::string_view name, float lr, std::string_view what) {
  OptimizerOptions o;
  if (name == "sgd") o = sgd(lr);
  else if (name == "momentum") o = sgd(lr, 0.9f);
  else if (name == "adam") o = adam(lr);
  else if (name == "adamw") o = adamw(lr, 0.01f);
  else
    throw InvalidArgument(std::string(what) + ": unknown optimizer " + in_quotes(name) +
                          " (choices: sgd, momentum, adam, adamw)");
  o.validate(what);
  return o;
}

void OptimizerOptions::validate(std::string_view who) const {
  auto bad = [&](const char* field, float value, const char* want) {
    throw InvalidArgument(std::string(who) + ": " + field + " " + num(value) + " is out of range (want " + want + ")");
  };
  if (!(lr >= 0.0f) || !std::isfinite(lr)) bad("lr", lr, "a finite lr >= 0");
  if (!(weight_decay >= 0.0f) || !std::isfinite(weight_decay)) bad("weight_decay", weight_decay, "finite, >= 0");
  switch (algorithm) {
    case Algorithm::sgd:
      if (!(momentum >= 0.0f && momentum < 1.0f)) bad("momentum", momentum, "0 <= momentum < 1");
      if (!(dampening >= 0.0f && dampening <= 1.0f)) bad("dampening", dampening, "0 <= dampening <= 1");
      if (nesterov && (momentum <= 0.0f || dampening != 0.0f))
        throw InvalidArgument(std::string(who) + ": nesterov needs momentum > 0 and dampening 0 (momentum " +
                              num(momentum) + ", dampening " + num(dampening) + ")");
      break;
    case Algorithm::adam:
    case Algorithm::adamw:
      if (!(beta1 >= 0.0f && beta1 < 1.0f)) bad("beta1", beta1, "0 <= beta1 < 1");
      if (!(beta2 >= 0.0f && beta2 < 1.0f)) bad("beta2", beta2, "0 <= beta2 < 1");
      if (!(eps > 0.0f) || !std::isfinite(eps)) bad("eps", eps, "finite, > 0");
      break;
    default:
      throw InvalidArgument(std::string(who) + ": algorithm " + std::to_string(static_cast<int>(algorithm)) +
                            " is not sgd, adam or adamw");
  }
}

std::string OptimizerOptions::str() const {
  std::string s = std::string(to_string(algorithm)) + "(lr " + num(lr);
  if (algorithm == Algorithm::sgd) {
    if (momentum != 0.0f) s += ", momentum " + num(momentum);
    if (dampening != 0.0f) s += ", dampening " + num(dampening);
    if (nesterov) s += ", nesterov";
    if (weight_decay != 0.0f) s += ", weight decay " + num(weight_decay);
  } else {
    s += ", betas (" + num(beta1) + ", " + num(beta2) + "), eps " + num(eps);
    if (algorithm == Algorithm::adamw || weight_decay != 0.0f) s += ", weight decay " + num(weight_decay);
  }
  if (!foreach) s += ", per parameter";
  return s + ")";
}

std::vector<std::string> OptimizerOptions::state_names() const {
  if (algorithm == Algorithm::sgd) {
    if (momentum == 0.0f) return {};
    return {"momentum_buffer", "step"};
  }
  return {"exp_avg", "exp_avg_sq", "step"};
}

// ---- the optimizer --------------------------------------------------------

struct Optimizer::Impl {
  std::vector<nn::Parameter*> params;
  OptimizerOptions options;
  std::int64_t steps = 0;
  std::vector<std::string> state_names;
  std::vector<std::string> names;  // per parameter
  // params.size() * state_names.size(), parameter by parameter; never
  // resized after construction, so Buffer pointers stay valid.
  std::vector<nn::Buffer> states;

  nn::Buffer& state(std::size_t param, std::size_t k) { return states[param * state_names.size() + k]; }

  kernels::OptimizerHyper hyper(float lr) const;
  void push(const std::vector<std::size_t>& group, float lr, const Tensor* skip, const Tensor* grad_scale);
};

kernels::OptimizerHyper Optimizer::Impl::hyper(float lr) const {
  const OptimizerOptions& o = options;
  kernels::OptimizerHyper h;
  switch (o.algorithm) {
    case Algorithm::sgd:
      h.kind = o.momentum != 0.0f ? kernels::OptimizerKind::sgd_momentum : kernels::OptimizerKind::sgd;
      break;
    case Algorithm::adam: h.kind = kernels::OptimizerKind::adam; break;
    case Algorithm::adamw: h.kind = kernels::OptimizerKind::adamw; break;
  }
  // Each constant in double from the float32 options, rounded once.
  const auto d = [](float v) { return static_cast<double>(v); };
  const auto f = [](double v) { return static_cast<float>(v); };
  h.lr = lr;
  h.weight_decay = o.algorithm == Algorithm::adamw ? 0.0f : o.weight_decay;
  h.decay = f(1.0 - d(lr) * d(o.weight_decay));
  h.momentum = o.momentum;
  h.one_minus_dampening = f(1.0 - d(o.dampening));
  h.nesterov = o.nesterov ? 1 : 0;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.one_minus_beta1 = f(1.0 - d(o.beta1));
  h.one_minus_beta2 = f(1.0 - d(o.beta2));
  h.eps = o.eps;
  return h;
}

void Optimizer::Impl::push(const std::vector<std::size_t>& group, float lr, const Tensor* skip,
                           const Tensor* grad_scale) {
  const std::size_t per = 1 + state_names.size();
  const std::size_t n_states = state_names.size();
  const bool has_step = n_states > 0;
  std::vector<const Tensor*> inputs, outputs;
  std::vector<std::int64_t> sizes;
  for (std::size_t p : group) {
    inputs.push_back(&params[p]->grad);
    outputs.push_back(&params[p]->value);
    for (std::size_t k = 0; k < n_states; ++k) outputs.push_back(&state(p, k).value);
    sizes.push_back(params[p]->value.numel());
  }
  const std::size_t n_grads = group.size();
  const bool has_skip = skip != nullptr, has_scale = grad_scale != nullptr;
  if (has_skip) inputs.push_back(skip);
  if (has_scale) inputs.push_back(grad_scale);
  const kernels::OptimizerHyper h = hyper(lr);
  const Device device = params[group.front()]->value.device();
  launch(op_name(options.algorithm), detail::exec_device(device), std::move(inputs), std::move(outputs),
         [h, sizes, n_grads, per, n_states, has_step, has_skip, has_scale](RunContext& ctx, OpIO& io) {
           std::vector<kernels::OptimizerTensor> tensors(n_grads);
           for (std::size_t j = 0; j < n_grads; ++j) {
             kernels::OptimizerTensor& t = tensors[j];
             t.g = io.i(j);
             t.w = io.o(j * per);
             if (n_states >= 2) t.s0 = io.o(j * per + 1);
             if (n_states >= 3) t.s1 = io.o(j * per + 2);
             if (has_step) t.step = io.o(j * per + n_states);
             t.n = sizes[j];
           }
           const float* skip_ptr = has_skip ? io.i(n_grads) : nullptr;
           const float* scale_ptr = has_scale ? io.i(n_grads + (has_skip ? 1 : 0)) : nullptr;
           if (ctx.gpu)
             WEFT_GPU_KERNEL("optimizer_step",
                             optimizer_step(*ctx.gpu, h, tensors.data(), tensors.size(), scale_ptr, skip_ptr));
           else
             cpu::optimizer_step(h, tensors.data(), tensors.size(), scale_ptr, skip_ptr);
         });
}

Optimizer::Optimizer(std::vector<nn::Parameter*> params, OptimizerOptions options)
    : impl_(std::make_unique<Impl>()) {
  options.validate("Optimizer");
  Impl& m = *impl_;
  m.options = options;
  m.state_names = options.state_names();
  for (std::size_t k = 0; k < params.size(); ++k) {
    const nn::Parameter* p = params[k];
    if (p == nullptr) throw InvalidArgument("Optimizer: parameter " + std::to_string(k) + " is null");
    const std::string name = parameter_name(*p, k);
    if (!p->value.defined())
      throw InvalidArgument("Optimizer: parameter " + in_quotes(name) + " has no value (an undefined Tensor)");
    if (p->value.dtype() != DType::float32)
      throw InvalidArgument("Optimizer: parameter " + in_quotes(name) + " " + detail::describe_on(p->value) +
                            " is not float32 (optimizers update float32 parameters; keep float32 master weights)");
    for (std::size_t j = 0; j < k; ++j)
      if (params[j] == p || params[j]->value.overlaps(p->value))
        throw InvalidArgument("Optimizer: parameter " + in_quotes(name) + " is listed twice (positions " +
                              std::to_string(j) + " and " + std::to_string(k) + ")");
    m.names.push_back(name);
  }
  m.params = std::move(params);
  m.states.reserve(m.params.size() * m.state_names.size());
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    const Tensor& v = m.params[k]->value;
    for (const std::string& s : m.state_names) {
      const Shape shape = s == "step" ? Shape{1} : v.shape();
      Tensor t = Tensor::zeros(v.engine(), shape, v.device());
      std::string full = m.names[k] + "." + s;
      t.set_name(full).set_role(MemoryRole::optimizer_state);
      m.states.push_back(nn::Buffer{std::move(full), std::move(t)});
    }
  }
}

Optimizer::~Optimizer() = default;
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;

void Optimizer::step(const StepInputs& inputs) { step(impl_->options.lr, inputs); }

void Optimizer::step(float lr, const StepInputs& inputs) {
  Impl& m = *impl_;
  const char* op = op_name(m.options.algorithm);
  if (!(lr >= 0.0f) || !std::isfinite(lr))
    throw InvalidArgument(std::string(op) + ": lr " + num(lr) + " is out of range (want a finite lr >= 0)");
  // Parameters grouped by device, in first-appearance order.
  std::vector<Device> devices;
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    const nn::Parameter& p = *m.params[k];
    const std::string& name = m.names[k];
    if (!p.value.defined() || p.value.dtype() != DType::float32)
      throw InvalidArgument(std::string(op) + ": parameter " + in_quotes(name) + " " + detail::describe_on(p.value) +
                            " is not a float32 tensor");
    if (!p.grad.defined())
      throw InvalidArgument(std::string(op) + ": parameter " + in_quotes(name) + " has no gradient (run backward first)");
    if (p.grad.dtype() != DType::float32 || p.grad.shape() != p.value.shape() || p.grad.device() != p.value.device() ||
        &p.grad.engine() != &p.value.engine())
      throw InvalidArgument(std::string(op) + ": the gradient " + detail::describe_on(p.grad) + " of parameter " +
                            in_quotes(name) + " " + detail::describe_on(p.value) +
                            " differs from it in shape, dtype or device");
    for (std::size_t s = 0; s < m.state_names.size(); ++s) {
      const Tensor& t = m.state(k, s).value;
      const Shape want = m.state_names[s] == "step" ? Shape{1} : p.value.shape();
      if (!t.defined() || t.dtype() != DType::float32 || t.shape() != want || t.device() != p.value.device())
        throw InvalidArgument(std::string(op) + ": state " + in_quotes(m.state(k, s).name) + " " +
                              detail::describe_on(t) + " does not fit parameter " + in_quotes(name) + " " +
                              detail::describe_on(p.value) + " (want float32 " + want.str() + " on its device)");
    }
    const Device d = p.value.device();
    std::size_t g = 0;
    while (g < devices.size() && devices[g] != d) ++g;
    if (g == devices.size()) {
      if (!devices.empty() && &p.value.engine() != &m.params[groups[0][0]]->value.engine())
        throw InvalidArgument(std::string(op) + ": parameter " + in_quotes(name) + " is on another engine than " +
                              in_quotes(m.names[groups[0][0]]));
      devices.push_back(d);
      groups.emplace_back();
    }
    groups[g].push_back(k);
  }
  // One skip and one grad_scale tensor per device at most, each [1] float32
  // on a parameter device.
  auto per_device = [&](const std::vector<Tensor>& list, const char* what) {
    std::vector<const Tensor*> found(devices.size(), nullptr);
    for (std::size_t j = 0; j < list.size(); ++j) {
      const Tensor& t = list[j];
      const std::string label = std::string(what) + " " + std::to_string(j);
      detail::check_float32(op, t, label.c_str());
      if (t.numel() != 1 || t.shape().rank() != 1)
        throw InvalidArgument(std::string(op) + ": " + label + " " + detail::describe_on(t) +
                              " must be a [1] float32 tensor");
      std::size_t g = 0;
      while (g < devices.size() && devices[g] != t.device()) ++g;
      if (g == devices.size())
        throw InvalidArgument(std::string(op) + ": " + label + " " + detail::describe_on(t) +
                              " is on no device of the parameters");
      if (&t.engine() != &m.params[groups[g][0]]->value.engine())
        throw InvalidArgument(std::string(op) + ": " + label + " " + detail::describe_on(t) +
                              " is on another engine than the parameters");
      if (found[g] != nullptr)
        throw InvalidArgument(std::string(op) + ": two " + what + " tensors on " + t.device().str() + " (" +
                              describe(*found[g]) + " and " + describe(t) + "); one per device");
      found[g] = &t;
    }
    return found;
  };
  const std::vector<const Tensor*> skips = per_device(inputs.skip, "skip");
  const std::vector<const Tensor*> scales = per_device(inputs.grad_scale, "grad_scale");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (m.options.foreach) {
      m.push(groups[g], lr, skips[g], scales[g]);
    } else {
      for (std::size_t k : groups[g]) m.push({k}, lr, skips[g], scales[g]);
    }
  }
  ++m.steps;
}

const OptimizerOptions& Optimizer::options() const noexcept { return impl_->options; }
std::int64_t Optimizer::steps() const noexcept { return impl_->steps; }

void Optimizer::set_steps(std::int64_t steps) {
  if (steps < 0) throw InvalidArgument("Optimizer::set_steps: steps " + std::to_string(steps) + " is negative");
  impl_->steps = steps;
}

const std::vector<nn::Parameter*>& Optimizer::parameters() const noexcept { return impl_->params; }

std::vector<nn::Buffer*> Optimizer::state() {
  std::vector<nn::Buffer*> out;
  out.reserve(impl_->states.size());
  for (nn::Buffer& b : impl_->states) out.push_back(&b);
  return out;
}

// ---- schedules ------------------------------------------------------------

namespace {

void check_warmup(std::int64_t warmup, const char* who) {
  if (warmup < 0) throw InvalidArgument(std::string(who) + ": warmup " + std::to_string(warmup) + " is negative");
}

}  // namespace

LrSchedule LrSchedule::constant(std::int64_t warmup) {
  check_warmup(warmup, "LrSchedule::constant");
  LrSchedule s;
  s.kind_ = Kind::constant;
  s.warmup_ = warmup;
  return s;
}

LrSchedule LrSchedule::step(std::int64_t step_size, float gamma, std::int64_t warmup) {
  check_warmup(warmup, "LrSchedule::step");
  if (step_size < 1)
    throw InvalidArgument("LrSchedule::step: step_size " + std::to_string(step_size) + " is out of range (want >= 1)");
  if (!(gamma > 0.0f) || !std::isfinite(gamma))
    throw InvalidArgument("LrSchedule::step: gamma " + num(gamma) + " is out of range (want finite, > 0)");
  LrSchedule s;
  s.kind_ = Kind::step;
  s.step_size_ = step_size;
  s.gamma_ = gamma;
  s.warmup_ = warmup;
  return s;
}

LrSchedule LrSchedule::cosine(std::int64_t total_steps, std::int64_t warmup) {
  check_warmup(warmup, "LrSchedule::cosine");
  if (total_steps <= warmup)
    throw InvalidArgument("LrSchedule::cosine: total_steps " + std::to_string(total_steps) +
                          " must exceed warmup " + std::to_string(warmup));
  LrSchedule s;
  s.kind_ = Kind::cosine;
  s.total_ = total_steps;
  s.warmup_ = warmup;
  return s;
}

float LrSchedule::factor(std::int64_t t) const noexcept {
  if (t < 0) t = 0;
  if (warmup_ > 0 && t < warmup_) return static_cast<float>(static_cast<double>(t + 1) / static_cast<double>(warmup_));
  const std::int64_t u = t - warmup_;
  switch (kind_) {
    case Kind::constant: return 1.0f;
    case Kind::step: return static_cast<float>(std::pow(static_cast<double>(gamma_), static_cast<double>(u / step_size_)));
    case Kind::cosine: {
      const std::int64_t span = total_ - warmup_;
      const double v = static_cast<double>(std::min(u, span));
      return static_cast<float>(0.5 * (1.0 + std::cos(std::numbers::pi * v / static_cast<double>(span))));
    }
  }
  return 1.0f;
}

std::string LrSchedule::str() const {
  std::string s;
  switch (kind_) {
    case Kind::constant: s = "constant"; break;
    case Kind::step: s = "step:" + std::to_string(step_size_) + ":" + num(gamma_); break;
    case Kind::cosine: s = "cosine:" + std::to_string(total_); break;
  }
  if (warmup_ > 0) s += ",warmup:" + std::to_string(warmup_);
  return s;
}

LrSchedule LrSchedule::parse(std::string_view text, std::string_view what) {
  const std::string forms = " (want constant, step:SIZE[:GAMMA] or cosine:TOTAL, each optionally followed by ,warmup:N)";
  auto fail = [&](const std::string& why) -> LrSchedule {
    throw InvalidArgument(std::string(what) + ": " + in_quotes(text) + ": " + why + forms);
  };
  auto integer = [&](std::string_view s, const char* field) {
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size())
      fail(std::string(field) + " " + in_quotes(s) + " is not an integer");
    return v;
  };
  std::string_view body = text;
  std::int64_t warmup = 0;
  if (const std::size_t comma = text.find(','); comma != std::string_view::npos) {
    body = text.substr(0, comma);
    const std::string_view tail = text.substr(comma + 1);
    if (tail.substr(0, 7) != "warmup:") return fail("after the comma only warmup:N may follow");
    warmup = integer(tail.substr(7), "warmup");
  }
  std::vector<std::string_view> parts;
  for (std::size_t at = 0;;) {
    const std::size_t colon = body.find(':', at);
    parts.push_back(body.substr(at, colon == std::string_view::npos ? std::string_view::npos : colon - at));
    if (colon == std::string_view::npos) break;
    at = colon + 1;
  }
  try {
    if (parts[0] == "constant" && parts.size() == 1) return constant(warmup);
    if (parts[0] == "step" && (parts.size() == 2 || parts.size() == 3)) {
      float gamma = 0.1f;
      if (parts.size() == 3) {
        auto [end, ec] = std::from_chars(parts[2].data(), parts[2].data() + parts[2].size(), gamma);
        if (parts[2].empty() || ec != std::errc() || end != parts[2].data() + parts[2].size())
          return fail("gamma " + in_quotes(parts[2]) + " is not a number");
      }
      return step(integer(parts[1], "step size"), gamma, warmup);
    }
    if (parts[0] == "cosine" && parts.size() == 2) return cosine(integer(parts[1], "total"), warmup);
  } catch (const InvalidArgument& e) {
    if (std::string_view(e.what()).substr(0, what.size()) == what) throw;
    return fail(e.what());
  }
  return fail("unknown form");
}

// ---- clipping ---------------------------------------------------------------

Tensor grad_norm_squared(const std::vector<Tensor>& grads) {
  constexpr const char* op = "grad_norm_squared";
  if (grads.empty()) throw InvalidArgument(std::string(op) + ": no gradients");
  std::vector<const Tensor*> inputs;
  std::vector<std::int64_t> sizes;
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const std::string what = "grad " + std::to_string(k);
    detail::check_float32(op, grads[k], what.c_str());
    if (grads[k].device() != grads[0].device() || &grads[k].engine() != &grads[0].engine())
      throw InvalidArgument(std::string(op) + ": " + what + " " + detail::describe_on(grads[k]) +
                            " is on another device than grad 0 " + detail::describe_on(grads[0]) +
                            " (one op per device: sum the partial norms)");
    inputs.push_back(&grads[k]);
    sizes.push_back(grads[k].numel());
  }
  Tensor out = detail::make_like(grads[0], Shape{1}, DType::float32);
  launch(op, detail::exec_device(grads[0].device()), std::move(inputs), {&out}, [sizes](RunContext& ctx, OpIO& io) {
    std::vector<const float*> xs(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) xs[k] = io.i(k);
    if (ctx.gpu)
      WEFT_GPU_KERNEL("grad_norm_squared", sum_squares(*ctx.gpu, io.o(0), xs.data(), sizes.data(), sizes.size()));
    else
      cpu::sum_squares(io.o(0), xs.data(), sizes.data(), sizes.size());
  });
  return out;
}

Tensor clip_coefficient(const Tensor& norm_sq, float max_norm) {
  constexpr const char* op = "clip_coefficient";
  detail::check_float32(op, norm_sq, "norm_sq");
  if (norm_sq.numel() != 1)
    throw InvalidArgument(std::string(op) + ": norm_sq " + describe(norm_sq) + " must hold one element");
  if (!(max_norm > 0.0f) || !std::isfinite(max_norm))
    throw InvalidArgument(std::string(op) + ": max_norm " + num(max_norm) + " is out of range (want finite, > 0)");
  Tensor coef = detail::make_like(norm_sq, Shape{1}, DType::float32);
  launch(op, detail::exec_device(norm_sq.device()), {&norm_sq}, {&coef}, [max_norm](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("clip_coefficient", clip_coefficient(*ctx.gpu, io.o(0), io.i(0), max_norm));
    else
      cpu::clip_coefficient(io.o(0), io.i(0), max_norm);
  });
  return coef;
}

}  // namespace weft::optim
