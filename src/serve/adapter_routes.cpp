#include "adapter_routes.h"

#include <fmt/format.h>

#include <memory>
#include <mutex>

namespace jumbo::serve {
namespace {

json adapter_model_json(const AdapterEntry& e, const ServedModel& model) {
  return {{"id", e.name},
          {"object", "model"},
          {"created", e.created},
          {"owned_by", "jumbo"},
          {"parent", model.name},
          {"root", e.path},
          {"max_model_len", model.shape.cache_positions},
          {"lora", {{"rank", e.lora.rank}, {"alpha", e.lora.alpha},
                    {"targets", describe(e.lora.targets)}}}};
}

std::string string_field(const json& body, const char* name) {
  const json* v = optional(body, name);
  if (!v) bad(name, "is required (a string)");
  if (!v->is_string()) bad(name, fmt::format("expected a string, got {}", quote(*v)));
  return v->get<std::string>();
}

}  // namespace

json base_model_json(const ServedModel& model, int64_t created) {
  return {{"id", model.name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "jumbo"},
          {"max_model_len", model.shape.cache_positions}};
}

json models_list_json(const ServedModel& model, int64_t created) {
  json data = json::array({base_model_json(model, created)});
  if (model.adapters) {
    for (const AdapterEntry& e : model.adapters->served()) data.push_back(adapter_model_json(e, model));
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

json model_json_of(const ServedModel& model, int64_t created, const std::string& id) {
  if (id == model.name) return base_model_json(model, created);
  if (model.adapters) {
    if (const auto e = model.adapters->find(id)) return adapter_model_json(*e, model);
  }
  throw model_not_found(json(id), model);
}

json post_adapter(const std::string& body_text, const ServedModel& model, JobQueue& queue) {
  const json body = parse_body(body_text);
  for (const auto& [key, value] : body.items()) {
    if (key != "name" && key != "path") {
      bad(key.size() > 64 ? key.substr(0, 64) + "..." : key,
          "unknown field (POST /v1/adapters takes: name, path)");
    }
  }
  auto load = std::make_shared<AdapterLoad>();
  load->name = string_field(body, "name");
  load->path = string_field(body, "path");
  if (const std::string problem = adapter_name_problem(load->name); !problem.empty()) {
    bad("name", fmt::format("{}: {}", quote(json(load->name)), problem));
  }
  if (load->name == model.name) bad("name", fmt::format("\"{}\" is the base model's", model.name));
  if (load->path.empty() || load->path.size() > 4096) bad("path", "expected 1 to 4096 characters");
  if (!model.adapters || model.adapters->slots() == 0) {
    throw ApiError(409, "", "this server holds no adapters: start it with --max-adapters N (and "
                            "--max-lora-rank R) to load them while it runs");
  }
  {
    std::lock_guard lock(queue.mu);
    if (queue.closing) throw ApiError(503, "", "the server is stopping", "server_error");
    queue.adapter_loads.push_back(load);
  }
  queue.wake.notify_one();
  std::unique_lock lock(load->mu);
  load->changed.wait(lock, [&] { return load->answered; });
  if (load->status != 200) {
    throw ApiError(load->status, load->status == 400 ? "path" : "", load->error,
                   load->status == 503 ? "server_error" : "invalid_request_error");
  }
  return adapter_model_json(load->entry, model);
}

json delete_adapter(const std::string& name, const ServedModel& model, JobQueue& queue) {
  if (!model.adapters || !model.adapters->mark_removing(name)) {
    throw ApiError(404, "", fmt::format("no adapter {} is served", quote(json(name))),
                   "invalid_request_error", "model_not_found");
  }
  queue.wake.notify_one();
  return {{"id", name}, {"object", "model"}, {"deleted", true}};
}

}  // namespace jumbo::serve
