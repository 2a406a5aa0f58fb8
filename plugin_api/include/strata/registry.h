// What a plugin's register function receives.
#pragma once

#include <memory>

#include "strata/component.h"

namespace strata {

class STRATA_API Registry {
 public:
  virtual ~Registry();
  // Takes ownership. A name already registered for the same kind is an error naming both plugins.
  virtual void add(std::unique_ptr<Component> component) = 0;
};

}  // namespace strata
