// CLI11 helpers: checked integer options and one parse step with the project's messages.
#include "harness/cli.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace minicp::harness {

namespace {
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

void check_kebab(const CLI::App& app) {
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& n : opt->get_lnames())
      if (n.find('_') != std::string::npos)
        throw std::logic_error(app.get_name() + ": flag --" + n + " is not kebab-case");
}

std::string join_list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}
}  // namespace

void parse(CLI::App& app, const Args& a, const std::function<void()>& more_help) {
  check_kebab(app);
  try {
    app.parse(a.argc(), a.argv());
  } catch (const CLI::CallForHelp&) {
    if (a.rank() == 0) {
      std::fputs(app.help().c_str(), stdout);
      std::fflush(stdout);
      if (more_help) more_help();
      std::fflush(stdout);
    }
    throw HelpShown{};
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(e.what()) + " (see --help)");
  }
}

std::string allowed_range(int64_t lo, int64_t hi) {
  const std::string l = std::to_string(lo), h = std::to_string(hi);
  if (hi == lo) return l;
  if (hi == lo + 1) return l + " or " + h;
  if (hi == kNoMax || hi == kIntMax) return ">= " + l;
  return "between " + l + " and " + h;
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  const bool integer =
      !text.empty() && (text[0] == '-' || text[0] == '+' || (text[0] >= '0' && text[0] <= '9')) && *end == '\0';
  const std::string at = flag + " " + text + ": must be ";
  if (!integer) throw UsageError(at + "an integer " + allowed_range(lo, hi));
  const bool too_big = (errno == ERANGE && v > 0) || v > hi;
  if (too_big && hi != lo + 1)  // above the range (or beyond int64): say where it ends
    throw UsageError(at + "between " + std::to_string(lo) + " and " + std::to_string(hi));
  if (errno == ERANGE || v < lo || v > hi) throw UsageError(at + allowed_range(lo, hi));
  return v;
}

std::string flag_label(const std::string& names) {
  std::string out, item;
  std::stringstream ss(names);
  while (std::getline(ss, item, ',')) {
    item = CLI::detail::trim_copy(item);
    if (!item.empty()) out += (out.empty() ? "" : "/") + item;
  }
  return out;
}

CLI::Option* add_int(CLI::App& app, const std::string& names, int64_t& out, int64_t lo, int64_t hi,
                     const std::string& help) {
  const std::string flag = flag_label(names);
  return app
      .add_option_function<std::string>(
          names, [&out, flag, lo, hi](const std::string& s) { out = parse_int(flag, s, lo, hi); }, help)
      ->default_str(std::to_string(out))
      ->type_name("INT");
}

CLI::Option* add_int(CLI::App& app, const std::string& names, int& out, int64_t lo, int64_t hi,
                     const std::string& help) {
  const std::string flag = flag_label(names);
  lo = std::max<int64_t>(lo, std::numeric_limits<int>::min());
  hi = std::min<int64_t>(hi, kIntMax);
  return app
      .add_option_function<std::string>(
          names, [&out, flag, lo, hi](const std::string& s) { out = int(parse_int(flag, s, lo, hi)); }, help)
      ->default_str(std::to_string(out))
      ->type_name("INT");
}

CLI::Option* add_int_list(CLI::App& app, const std::string& names, std::vector<int64_t>& out, int64_t lo, int64_t hi,
                          const std::string& help) {
  const std::string flag = flag_label(names);
  return app
      .add_option_function<std::string>(
          names,
          [&out, flag, lo, hi](const std::string& s) {
            std::vector<int64_t> v;
            size_t pos = 0;
            while (true) {
              const size_t comma = s.find(',', pos);
              const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
              if (item.empty())
                throw UsageError(flag + " '" + s + "': must be a comma list of integers " + allowed_range(lo, hi));
              v.push_back(parse_int(flag, item, lo, hi));
              if (comma == std::string::npos) break;
              pos = comma + 1;
            }
            out = v;
          },
          help)
      ->default_str(join_list(out))
      ->type_name("LIST");
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

std::string join_list(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace minicp::harness
