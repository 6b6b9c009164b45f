#include "core/flags.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/program_options.hpp"
#include "core/logging.h"

namespace po = boost::program_options;

namespace eps {

namespace {

// Registers every job option with Boost.Program_options, pointing at the
// JobConfig fields so that parsing fills them in.
class Registrar : public OptionVisitor {
 public:
  explicit Registrar(po::options_description* desc) : desc_(desc) {}
  void Visit(absl::string_view name, std::string* value, absl::string_view help) override {
    Add(name, po::value<std::string>(value)->default_value(*value), help);
  }
  void Visit(absl::string_view name, int64_t* value, absl::string_view help) override {
    Add(name, po::value<int64_t>(value)->default_value(*value), help);
  }
  void Visit(absl::string_view name, double* value, absl::string_view help) override {
    Add(name, po::value<double>(value)->default_value(*value, absl::StrCat(*value)), help);
  }
  void Visit(absl::string_view name, bool* value, absl::string_view help) override {
    Add(name, po::value<bool>(value)->default_value(*value), help);
  }
  void Visit(absl::string_view name, IntOrAuto* value, absl::string_view help) override {
    Add(name, po::value<IntOrAuto>(value)->default_value(*value, value->ToString()), help);
  }

 private:
  void Add(absl::string_view name, const po::value_semantic* semantic, absl::string_view help) {
    desc_->add_options()(std::string(name).c_str(), semantic, std::string(help).c_str());
  }
  po::options_description* desc_;
};

// The option name in a Boost error, without leading dashes.
std::string OptionName(const po::error_with_option_name& e) {
  std::string name = e.get_option_name();
  while (!name.empty() && name.front() == '-') name.erase(0, 1);
  return name;
}

// One non-blank, non-comment line of an INI file, read the way
// Boost.Program_options reads it (boost/libs/program_options/src/
// config_file.cpp): '#' starts a comment anywhere on a line, "[name]" sets
// the prefix "name.", and "key = value" is the option prefix + key.
struct IniLine {
  int number = 0;
  std::string text;    // without comment and surrounding whitespace
  std::string option;  // full option name; empty for section and invalid lines
  bool section = false;
};

std::vector<IniLine> ScanIni(const std::string& path) {
  std::vector<IniLine> lines;
  std::ifstream file(path);
  if (!file) return lines;
  std::string prefix;
  std::string raw;
  for (int number = 1; std::getline(file, raw); ++number) {
    absl::string_view text = raw;
    text = text.substr(0, text.find('#'));
    text = absl::StripAsciiWhitespace(text);
    if (text.empty()) continue;
    IniLine line;
    line.number = number;
    line.text = std::string(text);
    if (text.front() == '[' && text.back() == ']') {
      line.section = true;
      prefix = std::string(text.substr(1, text.size() - 2));
      if (!prefix.empty() && prefix.back() != '.') prefix += '.';
    } else if (const size_t eq = text.find('='); eq != absl::string_view::npos) {
      line.option = absl::StrCat(prefix, absl::StripAsciiWhitespace(text.substr(0, eq)));
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

// The line number of the `nth` (0-based) line setting `option`, or 0.
int NthOptionLine(const std::string& path, absl::string_view option, int nth) {
  for (const IniLine& line : ScanIni(path)) {
    if (line.option == option && nth-- == 0) return line.number;
  }
  return 0;
}

// Boost.Program_options formats an error by replacing each placeholder
// ("%value%") with its text until none is left, so a bad option or value
// that holds its own placeholder never finishes (boost/libs/program_options/
// src/value_semantic.cpp, replace_token). Such text is refused before Boost
// sees it.
constexpr const char* kBoostPlaceholders[] = {"%canonical_option%", "%option%",
                                              "%original_token%", "%value%", "%prefix%"};

// The first placeholder in `text`, or null.
const char* BoostPlaceholderIn(absl::string_view text) {
  for (const char* placeholder : kBoostPlaceholders) {
    if (absl::StrContains(text, placeholder)) return placeholder;
  }
  return nullptr;
}

// "PATH:LINE", or just PATH when the line is unknown.
std::string Where(const std::string& path, int line) {
  return line > 0 ? absl::StrCat(path, ":", line) : path;
}

}  // namespace

// How Boost.Program_options reads an IntOrAuto (found by argument-dependent
// lookup); a bad value names the option, as for any other type.
void validate(boost::any& out, const std::vector<std::string>& values, IntOrAuto*, int) {
  po::validators::check_first_occurrence(out);
  const std::string& text = po::validators::get_single_string(values);
  IntOrAuto parsed;
  if (!IntOrAuto::Parse(text, &parsed)) throw po::invalid_option_value(text);
  out = parsed;
}

struct CommandLine::Impl {
  po::options_description role{"Flags"};
  po::options_description job{"Job options (INI [section] key = value, or --section.key=value)"};
  std::vector<std::string> required;
  JobConfig config;
};

CommandLine::CommandLine(std::string program, std::string usage)
    : program_(std::move(program)), usage_(std::move(usage)), impl_(std::make_unique<Impl>()) {
  impl_->role.add_options()("help,h", "print this help and exit")(
      "config", po::value<std::string>(&config_path_), "job config file (INI)")(
      "v", po::value<int64_t>(&verbosity_)->default_value(0),
      "log verbosity: 1 membership events, 2 every message");
  Registrar registrar(&impl_->job);
  impl_->config.VisitOptions(registrar);
}

CommandLine::~CommandLine() = default;

void CommandLine::AddString(const std::string& name, std::string* target, const std::string& help,
                            bool required) {
  if (required) {
    impl_->role.add_options()(name.c_str(), po::value<std::string>(target), help.c_str());
    impl_->required.push_back(name);
  } else {
    impl_->role.add_options()(name.c_str(), po::value<std::string>(target)->default_value(*target),
                              help.c_str());
  }
}

void CommandLine::AddInt(const std::string& name, int64_t* target, const std::string& help) {
  impl_->role.add_options()(name.c_str(), po::value<int64_t>(target)->default_value(*target),
                            help.c_str());
}

void CommandLine::AddSwitch(const std::string& name, bool* target, const std::string& help) {
  impl_->role.add_options()(name.c_str(), po::bool_switch(target), help.c_str());
}

std::string CommandLine::Usage() const {
  std::ostringstream out;
  out << "usage: " << program_ << " " << usage_ << "\n\n" << impl_->role << "\n" << impl_->job;
  return out.str();
}

StatusOr<JobConfig> CommandLine::Parse(int argc, const char* const* argv) {
  po::options_description all;
  all.add(impl_->role).add(impl_->job);
  po::variables_map vm;

  for (int i = 1; i < argc; ++i) {
    if (const char* placeholder = BoostPlaceholderIn(argv[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "command line: argument ", i, " holds '", placeholder, "', which no option takes"));
    }
  }
  // The command line first: Boost keeps the first value stored for an
  // option, so --section.key overrides beat the file's.
  try {
    // No guessing: Boost would otherwise take --worker.batch for the
    // unique option it prefixes, worker.batch_size.
    const po::parsed_options parsed =
        po::command_line_parser(argc, argv)
            .options(all)
            .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
            .run();
    // Without a positional description Boost silently drops bare words.
    for (const po::option& option : parsed.options) {
      if (option.position_key != -1) {
        return absl::InvalidArgumentError(
            absl::StrCat("command line: unexpected argument '",
                         option.original_tokens.empty() ? "" : option.original_tokens.front(),
                         "' (options are --name=value)"));
      }
    }
    po::store(parsed, vm);
  } catch (const po::error& e) {
    return absl::InvalidArgumentError(absl::StrCat("command line: ", e.what()));
  }
  if (vm.count("help")) {
    help_requested_ = true;
    return JobConfig{};
  }
  if (!vm.count("config")) {
    return absl::InvalidArgumentError("missing --config JOB.ini (the job config file)");
  }
  const std::string path = vm["config"].as<std::string>();
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    // An ifstream opens a directory and reads nothing from it.
    return absl::InvalidArgumentError(
        absl::StrCat("--config: '", path, "' is a directory, not a config file"));
  }
  std::ifstream file(path);
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config: cannot open config file '", path, "': ", std::strerror(errno)));
  }
  for (const IniLine& line : ScanIni(path)) {
    if (const char* placeholder = BoostPlaceholderIn(line.text)) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, line.number), ": '", placeholder,
                                                     "' is no option's value or name"));
    }
  }
  try {
    po::store(po::parse_config_file(file, impl_->job, /*allow_unregistered=*/false), vm);
  } catch (const po::multiple_occurrences& e) {
    // Thrown at the repeat, so point there.
    const std::string name = OptionName(e);
    int line = NthOptionLine(path, name, 1);
    if (line == 0) line = NthOptionLine(path, name, 0);
    return absl::InvalidArgumentError(absl::StrCat(Where(path, line), ": ", e.what()));
  } catch (const po::invalid_config_file_syntax& e) {
    int line = 0;
    for (const IniLine& l : ScanIni(path)) {
      if (!l.section && l.option.empty() && l.text == e.tokens()) {
        line = l.number;
        break;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(Where(path, line), ": ", e.what()));
  } catch (const po::error_with_option_name& e) {
    const std::string name = OptionName(e);
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path, FindOptionLine(path, name)), ": ", e.what()));
  } catch (const po::error& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (file.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config: error reading config file '", path, "'"));
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    return absl::InvalidArgumentError(e.what());
  }
  for (const std::string& name : impl_->required) {
    if (!vm.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
    }
  }
  SetLogVerbosity(static_cast<int>(verbosity_));

  Status valid = impl_->config.Validate();
  if (!valid.ok()) {
    absl::optional<absl::Cord> option = valid.GetPayload(kOptionPayload);
    std::string where = "command line";
    if (option.has_value()) {
      const std::string name(option->Flatten());
      if (vm.count(name) && !vm[name].defaulted()) {
        // Which source set it: the command line wins, so look there first.
        bool on_command_line = false;
        for (int i = 1; i < argc; ++i) {
          absl::string_view arg = argv[i];
          if (arg == "--" + name || arg.rfind("--" + name + "=", 0) == 0) on_command_line = true;
        }
        if (!on_command_line) where = Where(path, FindOptionLine(path, name));
      } else {
        where = path;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", valid.message()));
  }
  config_path_ = path;
  return impl_->config;
}

int FindOptionLine(const std::string& path, absl::string_view option) {
  return NthOptionLine(path, option, 0);
}

}  // namespace eps
