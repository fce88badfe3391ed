#include "adapters.h"

#include <algorithm>

namespace jumbo {

std::string adapter_name_problem(const std::string& name) {
  if (name.empty() || name.size() > 128) return "expected 1 to 128 characters";
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '@' || c == '-';
    if (!ok) return "expected letters, digits and . _ : @ - only";
  }
  return "";
}

namespace serve {

AdapterUse::~AdapterUse() { table_.release(slot_); }

std::shared_ptr<const AdapterUse> AdapterTable::acquire(const std::string& name) {
  std::lock_guard lock(mu_);
  for (AdapterEntry& e : entries_) {
    if (e.name != name || e.removing) continue;
    ++e.uses;
    return std::make_shared<const AdapterUse>(*this, e.slot);
  }
  return nullptr;
}

void AdapterTable::release(int32_t slot) {
  std::lock_guard lock(mu_);
  for (AdapterEntry& e : entries_) e.uses -= e.slot == slot ? 1 : 0;
}

std::optional<AdapterEntry> AdapterTable::mark_removing(const std::string& name) {
  std::lock_guard lock(mu_);
  for (AdapterEntry& e : entries_) {
    if (e.name != name || e.removing) continue;
    e.removing = true;
    return e;
  }
  return std::nullopt;
}

int32_t AdapterTable::free_slot() const {
  std::lock_guard lock(mu_);
  for (int32_t s = 0; s < slots_; ++s) {
    if (std::none_of(entries_.begin(), entries_.end(),
                     [s](const AdapterEntry& e) { return e.slot == s; })) {
      return s;
    }
  }
  return -1;
}

bool AdapterTable::has_name(const std::string& name) const {
  std::lock_guard lock(mu_);
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const AdapterEntry& e) { return e.name == name; });
}

void AdapterTable::add(AdapterEntry entry) {
  std::lock_guard lock(mu_);
  entries_.push_back(std::move(entry));
}

std::vector<int32_t> AdapterTable::removable() const {
  std::lock_guard lock(mu_);
  std::vector<int32_t> out;
  for (const AdapterEntry& e : entries_) {
    if (e.removing && e.uses == 0) out.push_back(e.slot);
  }
  return out;
}

void AdapterTable::forget(int32_t slot) {
  std::lock_guard lock(mu_);
  std::erase_if(entries_, [slot](const AdapterEntry& e) { return e.slot == slot; });
}

std::vector<AdapterEntry> AdapterTable::served() const {
  std::lock_guard lock(mu_);
  std::vector<AdapterEntry> out;
  for (const AdapterEntry& e : entries_) {
    if (!e.removing) out.push_back(e);
  }
  std::sort(out.begin(), out.end(),
            [](const AdapterEntry& a, const AdapterEntry& b) { return a.slot < b.slot; });
  return out;
}

std::optional<AdapterEntry> AdapterTable::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  for (const AdapterEntry& e : entries_) {
    if (e.name == name && !e.removing) return e;
  }
  return std::nullopt;
}

}  // namespace serve
}  // namespace jumbo
