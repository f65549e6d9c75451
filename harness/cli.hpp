// Command-line helpers on CLI11, so every program refuses bad values the same way: integers
// are read as 64-bit and range-checked before they are narrowed (--heads=4294967297 is
// refused, not wrapped to 1), messages read "<flag> <value>: must be <what is allowed>",
// CLI11's own errors become UsageError, and flags are kebab-case.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "harness/main.hpp"

namespace minicp::harness {

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

// Parses a.args() with app. --help / -h: rank 0 prints app's help, then more_help (if
// given), and HelpShown is thrown. A CLI11 error throws UsageError("<CLI11 message> (see
// --help)"). A long flag with '_' in its name is a programming error (std::logic_error):
// flags are kebab-case.
void parse(CLI::App& app, const Args& a, const std::function<void()>& more_help = {});

// text as a decimal integer in [lo, hi], else UsageError "<flag> <text>: must be ...".
int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);

// What [lo, hi] allows, in words: "0 or 1", ">= 1" (hi = kNoMax or the target type's
// maximum), "between 2 and 8".
std::string allowed_range(int64_t lo, int64_t hi);

// An integer option (names as CLI11 takes them: "-n,--iters") stored into out after
// parse_int(lo, hi); hi is capped at out's type maximum. The help shows out's current
// value as the default.
CLI::Option* add_int(CLI::App& app, const std::string& names, int64_t& out, int64_t lo, int64_t hi,
                     const std::string& help);
CLI::Option* add_int(CLI::App& app, const std::string& names, int& out, int64_t lo, int64_t hi,
                     const std::string& help);
// A comma list of integers, each checked like add_int.
CLI::Option* add_int_list(CLI::App& app, const std::string& names, std::vector<int64_t>& out, int64_t lo, int64_t hi,
                          const std::string& help);

// The items of a comma list, as written ("a,,b": "a", "", "b"; "": none).
std::vector<std::string> split_list(const std::string& list);
// The items joined by ',' (split_list's inverse: a list flag's default).
std::string join_list(const std::vector<std::string>& items);

// How a flag is named in messages: its names joined by '/' ("-n/--iters", "--seq").
std::string flag_label(const std::string& names);

}  // namespace minicp::harness
