#pragma once
// The routes of LoRA adapters (docs/serve.md "Adapters"): the model objects of /v1/models (the
// base and each adapter, vLLM's shape: parent = the base, root = the adapter's path), and
// POST /v1/adapters and DELETE /v1/adapters/{name}, which change the served adapters while
// the server runs. Loading waits for the leader (it reads the adapter between engine steps);
// a removal answers at once and frees the slot once the adapter's requests have finished.
#include <cstdint>
#include <string>

#include "completions.h"
#include "leader.h"
#include "request_body.h"

namespace jumbo::serve {

json base_model_json(const ServedModel& model, int64_t created);
json models_list_json(const ServedModel& model, int64_t created);
// The base's or an adapter's object; ApiError 404 for another id.
json model_json_of(const ServedModel& model, int64_t created, const std::string& id);

// POST /v1/adapters {"name": NAME, "path": CHECKPOINT}: the adapter's model object once it is
// loaded. ApiError 400 (a bad body, a checkpoint that is not an adapter of this base), 409 (the
// name is taken, every slot is), 503 (stopping).
json post_adapter(const std::string& body, const ServedModel& model, JobQueue& queue);
// DELETE /v1/adapters/{name}: {"id", "object": "model", "deleted": true}; ApiError 404.
json delete_adapter(const std::string& name, const ServedModel& model, JobQueue& queue);

}  // namespace jumbo::serve
