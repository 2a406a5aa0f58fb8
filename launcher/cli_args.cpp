#include "cli_args.h"

#include <algorithm>
#include <charconv>

#include "strata/errors.h"

namespace strata::cli {

namespace {

// More ranks than any one launch of Strata plans for; a typo such as -n 100000 is refused
// before anything is forked.
constexpr int64_t kMaxRanks = 1 << 16;

int64_t parse_count(const std::string& option, const std::string& text, const char* what = "a rank count") {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1 || value > kMaxRanks)
    throw UserError(option + " expects " + what + " from 1 to " + std::to_string(kMaxRanks) + ", got '" + text + "'");
  return value;
}

// W+M: W warm-up steps (0 or more) and M measured steps (1 or more), e.g. 2+4.
void parse_trial_steps(const std::string& option, const std::string& text, int64_t& warmup, int64_t& measured) {
  const size_t plus = text.find('+');
  const char* first = text.data();
  const char* last = text.data() + text.size();
  int64_t w = -1, m = 0;
  bool ok = plus != std::string::npos;
  if (ok) {
    auto [w_end, w_ec] = std::from_chars(first, first + plus, w);
    auto [m_end, m_ec] = std::from_chars(first + plus + 1, last, m);
    ok = w_ec == std::errc() && w_end == first + plus && m_ec == std::errc() && m_end == last && w >= 0 && w <= 1000 && m >= 1 && m <= 1000;
  }
  if (!ok)
    throw UserError(option + " expects warm-up + measured steps, 0 or more and 1 or more (e.g. 2+4, or 1+1 for the peak memory only), got '" +
                    text + "'");
  warmup = w, measured = m;
}

double parse_gib(const std::string& option, const std::string& text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !(value > 0) || value > 1e6)
    throw UserError(option + " expects a size in GiB above 0 (e.g. 1.5), got '" + text + "'");
  return value;
}

// ckpt export's weights: fp32, bf16 or fp16, as the amp pass names them.
std::string parse_export_dtype(const std::string& option, const std::string& text) {
  if (text == "fp32" || text == "bf16" || text == "fp16") return text;
  throw UserError(option + " expects fp32, bf16 or fp16, got '" + text + "'");
}

// ckpt export's largest weight file: bytes, or with a unit as transformers writes it (5GB,
// 500MB, 2GiB; GB and MB are powers of ten, GiB and MiB of two).
uint64_t parse_byte_size(const std::string& option, const std::string& text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string unit(end, text.data() + text.size());
  static const std::vector<std::pair<std::string, double>> units{{"", 1},       {"B", 1},         {"KB", 1e3},
                                                                 {"MB", 1e6},   {"GB", 1e9},      {"KiB", 1024.0},
                                                                 {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  const auto it = std::find_if(units.begin(), units.end(), [&](const auto& u) { return u.first == unit; });
  if (ec != std::errc() || it == units.end() || !(value * it->second >= 1) || value * it->second > 1e15)
    throw UserError(option + " expects a size such as 5GB, 500MB or 2GiB (or bytes), got '" + text + "'");
  return static_cast<uint64_t>(value * it->second);
}

// A whole number from 0 on (sample's --tokens, --top-k, --seed).
int64_t parse_natural(const std::string& option, const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0)
    throw UserError(option + " expects a whole number from 0, got '" + text + "'");
  return value;
}

double parse_temperature(const std::string& option, const std::string& text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !(value >= 0) || value > 1e6)
    throw UserError(option + " expects a temperature from 0 (greedy), e.g. 0.8, got '" + text + "'");
  return value;
}

double parse_fraction(const std::string& option, const std::string& text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !(value >= 0) || value > 0.5)
    throw UserError(option + " expects a fraction from 0 to 0.5, e.g. 0.05, got '" + text + "'");
  return value;
}

// "90s", "10m", "1h" or plain seconds.
double parse_duration(const std::string& option, const std::string& text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string unit(end, text.data() + text.size());
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : 0;
  if (ec != std::errc() || scale == 0 || !(value > 0))
    throw UserError(option + " expects a duration such as 90s, 10m or 1h, got '" + text + "'");
  return value * scale;
}

}  // namespace

Args parse_args(int argc, char** argv) {
  Args args;
  args.argc = argc;
  args.argv = argv;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string inline_value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0) {
      if (auto eq = arg.find('='); eq != std::string::npos) {
        inline_value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline = true;
      }
    }
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) throw UserError(arg + " needs a value");
      return argv[++i];
    };
    auto flag = [&] {
      if (has_inline) throw UserError(arg + " takes no value");
      args.given.push_back(arg);
    };
    if (arg == "-h" || arg == "--help") flag(), args.help = true;
    else if (arg == "--version") flag(), args.version = true;
    else if (arg == "-v" || arg == "--verbose") flag(), args.verbose = true;
    else if (arg == "--json") flag(), args.json = true;
    else if (arg == "--resume") flag(), args.resume = true;
    else if (arg == "--overwrite") flag(), args.overwrite = true;
    else if (arg == "--out") args.given.push_back(arg), args.out_dir = value();
    else if (arg == "--set") args.given.push_back(arg), args.sets.push_back(value());
    else if (arg == "--disable") args.given.push_back(arg), args.disables.push_back(value());
    else if (arg == "-n" || arg == "--ranks") args.given.push_back(arg), args.ranks = parse_count(arg, value());
    else if (arg == "--simulate-nodes") args.given.push_back(arg), args.simulate_nodes = parse_count(arg, value(), "a node count");
    else if (arg == "--dry-run") flag(), args.dry_run = true;
    else if (arg == "--finetune") flag(), args.finetune = true;
    else if (arg == "--remeasure") flag(), args.remeasure = true;
    else if (arg == "--memory-gb") args.given.push_back(arg), args.memory_gb = parse_gib(arg, value());
    else if (arg == "--budget") args.given.push_back(arg), args.budget_s = parse_duration(arg, value());
    else if (arg == "--top") args.given.push_back(arg), args.top = parse_count(arg, value(), "a candidate count");
    else if (arg == "--rounds") args.given.push_back(arg), args.rounds = parse_count(arg, value(), "a trial count");
    else if (arg == "--trial-steps") args.given.push_back(arg), parse_trial_steps(arg, value(), args.trial_warmup_steps, args.trial_measured_steps);
    else if (arg == "-o" || arg == "--output") args.given.push_back(arg), args.output = value();
    else if (arg == "--prompt") args.given.push_back(arg), args.prompt = value();
    else if (arg == "--tokens") args.given.push_back(arg), args.sample_tokens = parse_natural(arg, value());
    else if (arg == "--temperature") args.given.push_back(arg), args.temperature = parse_temperature(arg, value());
    else if (arg == "--top-k") args.given.push_back(arg), args.top_k = parse_natural(arg, value());
    else if (arg == "--seed") args.given.push_back(arg), args.seed = parse_natural(arg, value());
    else if (arg == "--tokenizer") args.given.push_back(arg), args.tokenizer = value();
    else if (arg == "--train-tokenizer") args.given.push_back(arg), args.train_tokenizer = parse_count(arg, value(), "a vocabulary size");
    else if (arg == "--text-field") args.given.push_back(arg), args.text_field = value();
    else if (arg == "--val-fraction") args.given.push_back(arg), args.val_fraction = parse_fraction(arg, value());
    else if (arg == "--eos") args.given.push_back(arg), args.eos = value();
    else if (arg == "--dtype") args.given.push_back(arg), args.dtype = parse_export_dtype(arg, value());
    else if (arg == "--max-shard-size") args.given.push_back(arg), args.max_shard_bytes = parse_byte_size(arg, value());
    else if (arg.size() > 1 && arg[0] == '-') throw UserError("unknown option '" + arg + "'; see strata --help");
    else if (args.command.empty()) args.command = arg;
    else args.positional.push_back(arg);
  }
  return args;
}

void allow_only(const Args& args, const std::vector<std::string>& options) {
  static const std::vector<std::string> everywhere{"-h", "--help", "-v", "--verbose"};
  for (const auto& given : args.given) {
    bool ok = std::find(options.begin(), options.end(), given) != options.end() ||
              std::find(everywhere.begin(), everywhere.end(), given) != everywhere.end();
    if (!ok)
      throw UserError("'strata " + args.command + "' does not take " + given + "; see strata " + args.command + " --help");
  }
}

}  // namespace strata::cli
