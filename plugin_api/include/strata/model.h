// Model factories: build a strata::nn::Model from [model].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/component.h"
#include "strata/nn.h"

namespace strata {

class STRATA_API ModelFactory : public Component {
 public:
  using Component::Component;
  ~ModelFactory() override;
  // Parameters are initialised from the current global RNG state (core seeds it).
  virtual std::shared_ptr<nn::Model> create(const Config& config) const = 0;
};

}  // namespace strata
