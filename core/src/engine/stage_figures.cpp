#include "engine/stage_figures.h"

#include <algorithm>
#include <map>

#include "strata/step_program.h"

namespace strata::engine {

namespace {
// A step's figures summed by name on this rank (a name may come from several modules).
std::map<std::string, at::Tensor> local_sums(const StageFigures::Figures& figures) {
  std::map<std::string, at::Tensor> sums;
  for (const auto& [name, value] : figures) {
    const at::Tensor v = value.detach().to(at::kDouble).reshape({});
    auto [it, inserted] = sums.emplace(name, v);
    if (!inserted) it->second = it->second.to(v.device()) + v;
  }
  return sums;
}
}  // namespace

void StageFigures::agree(const std::vector<Figures>& steps) {
  std::set<std::string> names(names_.begin(), names_.end());
  for (const auto& figures : steps)
    for (const auto& [name, value] : figures) names.insert(name);
  std::string joined;
  for (const auto& name : names) joined += name + '\n';
  // Every rank's text, padded to the longest; each character as an int64 (any backend takes it).
  const auto ranks = static_cast<int64_t>(stages_.size());
  const auto long_on_device = at::TensorOptions().dtype(at::kLong).device(device_);
  at::Tensor lengths = at::empty({ranks}, long_on_device);
  stages_.all_gather(lengths, at::full({1}, static_cast<int64_t>(joined.size()), long_on_device))->wait();
  const std::vector<double> length_of = read_on_host({lengths});
  const auto longest = static_cast<int64_t>(*std::max_element(length_of.begin(), length_of.end()));
  std::vector<int64_t> mine(static_cast<size_t>(longest), 0);
  std::copy(joined.begin(), joined.end(), mine.begin());
  at::Tensor texts = at::empty({ranks * longest}, long_on_device);
  if (longest > 0) {
    stages_.all_gather(texts, at::tensor(mine, at::kLong).to(device_))->wait();
    const std::vector<double> characters = read_on_host({texts});
    for (int64_t r = 0; r < ranks; ++r) {
      std::string name;
      for (int64_t i = 0; i < static_cast<int64_t>(length_of[static_cast<size_t>(r)]); ++i) {
        const char c = static_cast<char>(characters[static_cast<size_t>(r * longest + i)]);
        if (c != '\n') {
          name += c;
        } else {
          names.insert(name);
          name.clear();
        }
      }
    }
  }
  names_.assign(names.begin(), names.end());
  agreed_ = true;
}

at::Tensor StageFigures::reduce(const std::vector<Figures>& steps) {
  if (!agreed_) agree(steps);
  const auto n = static_cast<int64_t>(names_.size()), count = static_cast<int64_t>(steps.size());
  const at::Tensor zero = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  std::vector<at::Tensor> values;
  std::vector<double> presence;  // per step: 1/0 per name, then the count of names not agreed
  for (const auto& figures : steps) {
    std::map<std::string, at::Tensor> sums = local_sums(figures);
    for (const auto& name : names_) {
      auto it = sums.find(name);
      values.push_back(it == sums.end() ? zero : it->second.to(device_));
      presence.push_back(it == sums.end() ? 0.0 : 1.0);
      if (it != sums.end()) sums.erase(it);
    }
    presence.push_back(static_cast<double>(sums.size()));
  }
  at::Tensor value_part = n > 0 ? at::stack(values).view({count, n}) : at::zeros({count, 0}, zero.options());
  at::Tensor matrix = at::cat({value_part, at::tensor(presence, at::kDouble).to(device_).view({count, n + 1})}, 1).contiguous();
  stages_.all_reduce(matrix, ReduceOp::Sum)->wait();
  return matrix;
}

std::vector<StageFigures::Named> StageFigures::decode(const std::vector<double>& read, const std::vector<Figures>& steps) {
  const size_t n = names_.size(), width = 2 * n + 1;
  bool unknown = false;
  for (size_t s = 0; s < steps.size(); ++s) unknown = unknown || read[s * width + 2 * n] > 0;
  if (unknown) {  // every rank read the same sums, so all of them come here
    agree(steps);
    return decode(read_on_host({reduce(steps)}), steps);
  }
  std::vector<Named> out(steps.size());
  for (size_t s = 0; s < steps.size(); ++s)
    for (size_t i = 0; i < n; ++i)
      if (read[s * width + n + i] > 0) out[s].emplace_back(names_[i], read[s * width + i]);
  return out;
}

}  // namespace strata::engine
