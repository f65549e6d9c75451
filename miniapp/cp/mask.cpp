#include "miniapp/cp/mask.hpp"

#include <algorithm>
#include <climits>
#include <stdexcept>

namespace minicp::cp {

const std::vector<std::string>& Mask::kind_names() {
  static const std::vector<std::string> names = {"causal", "full", "window", "documents"};
  return names;
}

namespace {
std::string kinds_in_words() {
  std::string all;
  for (const std::string& s : Mask::kind_names()) all += (all.empty() ? "" : ", ") + s;
  return all;
}
}  // namespace

Mask::Kind Mask::parse_kind(const std::string& name) {
  const std::vector<std::string>& n = kind_names();
  const auto it = std::find(n.begin(), n.end(), name);
  if (it == n.end()) throw std::invalid_argument("mask \"" + name + "\": not one of " + kinds_in_words());
  return Kind(it - n.begin());
}

Mask Mask::full() { return Mask(Kind::Full, 0, 0); }

Mask Mask::window(int64_t tokens) {
  if (tokens < 1) throw std::invalid_argument("window mask: needs tokens >= 1, got " + std::to_string(tokens));
  return Mask(Kind::Window, tokens, 0);
}

Mask Mask::equal_documents(int64_t len) {
  if (len < 1) throw std::invalid_argument("documents mask: needs a length >= 1, got " + std::to_string(len));
  return Mask(Kind::Documents, 0, len);
}

Mask Mask::documents(const std::vector<int64_t>& lengths) {
  if (lengths.empty()) throw std::invalid_argument("documents mask: needs at least one document");
  auto starts = std::make_shared<std::vector<int64_t>>();
  starts->reserve(lengths.size());
  int64_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1)
      throw std::invalid_argument("documents mask: document " + std::to_string(i) + " has length " +
                                  std::to_string(lengths[i]) + " (each must be >= 1)");
    starts->push_back(at);
    if (lengths[i] > INT64_MAX - at) throw std::invalid_argument("documents mask: the lengths' sum overflows");
    at += lengths[i];
  }
  Mask m(Kind::Documents, 0, 0);
  m.starts_ = std::move(starts);
  return m;
}

std::vector<Mask> Mask::examples(int64_t S) {
  const int64_t quarter = std::max<int64_t>(1, S / 4);
  return {causal(), full(), window(quarter), equal_documents(quarter)};
}

std::string Mask::problem(const MaskSpec& s, const MaskNames& n) {
  const std::vector<std::string>& names = kind_names();
  const auto it = std::find(names.begin(), names.end(), s.kind);
  if (it == names.end()) return n.kind + " = \"" + s.kind + "\": not one of " + kinds_in_words();
  const Kind kind = Kind(it - names.begin());
  auto with = [&](const std::string& size, const char* k) {
    return size + ": needs a value >= 1 with " + n.kind + " = \"" + k + "\"";
  };
  auto only = [&](const std::string& size, int64_t v, const char* k) {
    return size + " = " + std::to_string(v) + ": only with " + n.kind + " = \"" + k + "\"";
  };
  if (kind == Kind::Window && s.window < 1) return with(n.window, "window");
  if (kind != Kind::Window && s.window != 0) return only(n.window, s.window, "window");
  if (s.listed && kind != Kind::Documents) return n.listed + ": only with " + n.kind + " = \"documents\"";
  if (s.listed && s.doc_len != 0)
    return n.doc_len + " = " + std::to_string(s.doc_len) + ": not with " + n.listed +
           " (the documents' lengths are listed)";
  if (kind == Kind::Documents && !s.listed && s.doc_len < 1)
    return n.doc_len + ": needs a value >= 1 with " + n.kind + " = \"documents\"" +
           (n.listed.empty() ? "" : " (or documents of listed lengths: " + n.listed + ")");
  if (kind != Kind::Documents && s.doc_len != 0) return only(n.doc_len, s.doc_len, "documents");
  return "";
}

Mask Mask::from(const MaskSpec& s) {
  const std::string why = problem(s, {"mask", "window", "doc_len", "lengths"});
  if (!why.empty()) throw std::invalid_argument(why);
  if (s.listed) throw std::invalid_argument("a mask of listed documents needs their lengths (Mask::documents)");
  switch (parse_kind(s.kind)) {
    case Kind::Full: return full();
    case Kind::Window: return window(s.window);
    case Kind::Documents: return equal_documents(s.doc_len);
    case Kind::Causal: break;
  }
  return causal();
}

const char* Mask::name() const {
  static const char* const names[] = {"causal", "full", "window", "documents"};
  return names[int(kind_)];
}

std::string Mask::describe() const {
  if (kind_ == Kind::Window) return std::string(name()) + " " + std::to_string(window_);
  if (kind_ == Kind::Documents && period_ > 0) return std::string(name()) + " of " + std::to_string(period_);
  if (kind_ == Kind::Documents) return std::string(name()) + " (" + std::to_string(doc_starts().size()) + ")";
  return name();
}

const std::vector<int64_t>& Mask::doc_starts() const {
  static const std::vector<int64_t> none;
  return starts_ ? *starts_ : none;
}

std::vector<int64_t> Mask::doc_lengths(int64_t S) const {
  std::vector<int64_t> out;
  if (kind_ != Kind::Documents) return {S};
  if (period_ > 0) {
    out.assign(size_t(S / period_), period_);
    if (S % period_ != 0) out.push_back(S % period_);
    return out;
  }
  const std::vector<int64_t>& s = *starts_;
  for (size_t i = 0; i < s.size() && s[i] < S; ++i) out.push_back(std::min(i + 1 < s.size() ? s[i + 1] : S, S) - s[i]);
  return out;
}

double Mask::area(int64_t S) const {
  auto tri = [](double n) { return n * (n + 1) / 2; };  // a causal square of n tokens
  const double s = double(S);
  switch (kind_) {
    case Kind::Full: return s * s;
    case Kind::Window: return S <= window_ ? tri(s) : tri(double(window_)) + (s - double(window_)) * double(window_);
    case Kind::Documents: {
      if (period_ > 0) return double(S / period_) * tri(double(period_)) + tri(double(S % period_));
      double a = 0;
      for (int64_t len : doc_lengths(S)) a += tri(double(len));
      return a;
    }
    case Kind::Causal: break;
  }
  return tri(s);
}

int64_t Mask::doc_of(int64_t pos) const {
  if (kind_ != Kind::Documents) return 0;
  if (period_ > 0) return pos / period_;
  const std::vector<int64_t>& s = *starts_;
  return int64_t(std::upper_bound(s.begin(), s.end(), pos) - s.begin()) - 1;
}

std::pair<int64_t, int64_t> Mask::keys_of(int64_t q) const {
  switch (kind_) {
    case Kind::Full: return {0, INT64_MAX};
    case Kind::Window: return {std::max<int64_t>(0, q - window_ + 1), q};
    case Kind::Documents: return {period_ > 0 ? q / period_ * period_ : (*starts_)[size_t(doc_of(q))], q};
    case Kind::Causal: break;
  }
  return {0, q};
}

bool Mask::fully_masked(int64_t qmin, int64_t qmax, int64_t kmin, int64_t kmax) const {
  if (is_causal() && kmin > qmax) return true;  // every key after every query
  if (kind_ == Kind::Window && kmax <= qmin - window_) return true;
  return kind_ == Kind::Documents && (doc_of(kmax) < doc_of(qmin) || doc_of(kmin) > doc_of(qmax));
}

}  // namespace minicp::cp
