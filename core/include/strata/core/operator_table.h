// The process-wide operator table: core's reference implementations plus those plugins register.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "strata/core/component_registry.h"
#include "strata/ops.h"

namespace strata {

class STRATA_API OperatorTable {
 public:
  static OperatorTable& global();

  // Adds every operator implementation in `registry`. Unknown operator names are UserErrors.
  void install(const ComponentRegistry& registry);
  // Back to the reference implementations only.
  void reset();

  // Highest priority first; the reference (priority 0) is always last.
  const std::vector<const ops::OperatorImplBase*>& implementations(const std::string& op) const;
  std::vector<std::string> operators() const;
  const ops::OperatorImplBase& select(const std::string& op, const at::Tensor& probe) const;

 private:
  OperatorTable();
  std::map<std::string, std::vector<const ops::OperatorImplBase*>> table_;
};

}  // namespace strata
