#include "models/batch.h"

#include "core/logging.h"

namespace eps {

BatchBuilder::BatchBuilder(int num_dense, int num_fields) {
  batch_.num_dense = num_dense;
  batch_.num_fields = num_fields;
}

void BatchBuilder::Add(float label, std::span<const float> dense,
                       std::span<const uint64_t> ids) {
  CHECK_EQ(dense.size(), static_cast<size_t>(batch_.num_dense));
  CHECK_EQ(ids.size(), static_cast<size_t>(batch_.num_fields));
  batch_.labels.push_back(label);
  batch_.dense.insert(batch_.dense.end(), dense.begin(), dense.end());
  for (uint64_t id : ids) {
    auto [it, inserted] = index_.try_emplace(id, static_cast<uint32_t>(batch_.keys.size()));
    if (inserted) batch_.keys.push_back(id);
    batch_.slots.push_back(it->second);
  }
}

Batch BatchBuilder::Finish() {
  Batch out = std::move(batch_);
  batch_ = Batch{};
  batch_.num_dense = out.num_dense;
  batch_.num_fields = out.num_fields;
  index_.clear();
  return out;
}

}  // namespace eps
