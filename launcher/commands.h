// The strata subcommands. Each returns the process exit status.
#pragma once

#include <vector>

#include "cli_args.h"
#include "strata/errors.h"

namespace strata::cli {

struct Command {
  const char* name;
  const char* summary;
  const char* usage;  // full help text
  int (*run)(const Args& args);
};

const std::vector<Command>& commands();

int run_plugins(const Args& args);
int run_plan(const Args& args);
int run_train(const Args& args);
int run_ckpt(const Args& args);
int run_sample(const Args& args);
int run_data(const Args& args);
int run_ops(const Args& args);
int run_docs(const Args& args);
int run_doctor(const Args& args);
int run_report(const Args& args);
int run_tune(const Args& args);

}  // namespace strata::cli
