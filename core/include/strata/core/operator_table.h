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

  // Replaces the table by core's references plus every operator implementation in `registry`:
  // operators plugins define first, then implementations. The table points into the registry's
  // components, so it must be installed again before use once that registry is gone. UserErrors: an implementation of an undefined operator, one whose function
  // type differs from the definer's, an operator defined twice.
  void install(const ComponentRegistry& registry);
  // Back to core's operators and reference implementations, without pins.
  void reset();
  // Gives every implementation the job (OperatorImplBase::bind), once per job.
  void bind(Job& job) const;
  void pin(const std::string& op, const std::string& impl, const std::vector<std::string>& blocks);

  // Highest priority first; the reference (priority 0) is always last.
  const std::vector<const ops::OperatorImplBase*>& implementations(const std::string& op) const;
  std::vector<std::string> operators() const;
  // The implementation pinned for the running block (ops::BlockScope), else the first that
  // supports the probe.
  const ops::OperatorImplBase& select(const std::string& op, const at::Tensor& probe) const;
  // Where each operator was defined: "core" or "plugin NAME".
  const std::string& defined_by(const std::string& op) const { return defined_by_.at(op); }
  struct Pin {
    std::string op;
    const ops::OperatorImplBase* impl;
    std::vector<std::string> blocks;  // empty: every block
  };
  const std::vector<Pin>& pins() const { return pins_; }

 private:
  OperatorTable();
  std::map<std::string, std::vector<const ops::OperatorImplBase*>> table_;
  std::map<std::string, std::string> defined_by_;
  std::vector<Pin> pins_;
};

}  // namespace strata
