#pragma once
// The LoRA adapters a server runs over its base, by name (docs/serve.md "Adapters"). Handler
// threads read the table (a request's `model`, /v1/models) and mark removals (DELETE); the
// leader's thread alone loads adapters into engine slots and frees them. A request holds a use
// of its adapter from parsing to its last token, so a removal frees the slot only when no
// accepted request needs it: requests in flight are never dropped or switched to another
// adapter that reuses the slot.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/serve/server.h"

namespace jumbo::serve {

struct AdapterEntry {
  std::string name;  // what clients put in "model"
  std::string path;  // as given (--adapter, POST /v1/adapters)
  int32_t slot = -1;
  LoraShape lora;
  int64_t created = 0;
  bool removing = false;  // DELETE asked: no new requests; freed when unused
  int64_t uses = 0;       // requests accepted and not yet destroyed
};

class AdapterTable;

// A request's hold on its adapter; released when the last copy goes.
class AdapterUse {
 public:
  AdapterUse(AdapterTable& table, int32_t slot) : table_(table), slot_(slot) {}
  ~AdapterUse();
  AdapterUse(const AdapterUse&) = delete;
  AdapterUse& operator=(const AdapterUse&) = delete;
  int32_t slot() const { return slot_; }

 private:
  AdapterTable& table_;
  int32_t slot_;
};

class AdapterTable {
 public:
  explicit AdapterTable(int64_t slots) : slots_(slots) {}
  int64_t slots() const { return slots_; }
  // A use of the adapter `name` unless it is absent or being removed.
  std::shared_ptr<const AdapterUse> acquire(const std::string& name);
  // DELETE: marks the adapter; its entry when there was one not already marked.
  std::optional<AdapterEntry> mark_removing(const std::string& name);
  // The leader: a slot no entry holds (-1 when all do), whether a name is taken (by an adapter
  // served or being removed), and adding the one it loaded.
  int32_t free_slot() const;
  bool has_name(const std::string& name) const;
  void add(AdapterEntry entry);
  // The leader: slots marked for removal that no request uses now. forget() then drops one.
  std::vector<int32_t> removable() const;
  void forget(int32_t slot);
  // The adapters served (not being removed), by slot.
  std::vector<AdapterEntry> served() const;
  std::optional<AdapterEntry> find(const std::string& name) const;

 private:
  friend class AdapterUse;
  void release(int32_t slot);

  mutable std::mutex mu_;
  int64_t slots_;
  std::vector<AdapterEntry> entries_;
};

}  // namespace jumbo::serve
