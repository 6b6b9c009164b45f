#include "models/batch.h"

#include "core/logging.h"

namespace eps {

void Batch::CheckShape() const {
  const size_t n = labels.size();
  CHECK_EQ(dense.size(), n * num_dense);
  if (offsets.empty()) {
    CHECK_EQ(slots.size(), n * num_fields);
  } else {
    CHECK_EQ(offsets.size(), n * num_fields + 1);
    CHECK_EQ(offsets.back(), slots.size());
  }
}

Batch SliceBatch(const Batch& batch, int begin, int end, std::vector<uint32_t>* from) {
  CHECK(0 <= begin && begin <= end && end <= batch.size()) << begin << ".." << end;
  Batch out;
  out.num_dense = batch.num_dense;
  out.num_fields = batch.num_fields;
  out.labels.assign(batch.labels.begin() + begin, batch.labels.begin() + end);
  const size_t dense = static_cast<size_t>(batch.num_dense);
  out.dense.assign(batch.dense.begin() + begin * dense, batch.dense.begin() + end * dense);
  const uint32_t slot_begin = batch.field_begin(begin, 0);
  const uint32_t slot_end = end == batch.size() ? static_cast<uint32_t>(batch.slots.size())
                                                : batch.field_begin(end, 0);
  // Old key index -> new; kNone until the slice first uses it.
  constexpr uint32_t kNone = ~uint32_t{0};
  std::vector<uint32_t> renumbered(batch.keys.size(), kNone);
  from->clear();
  out.slots.reserve(slot_end - slot_begin);
  for (uint32_t j = slot_begin; j < slot_end; ++j) {
    const uint32_t old_key = batch.slots[j];
    if (renumbered[old_key] == kNone) {
      renumbered[old_key] = static_cast<uint32_t>(out.keys.size());
      out.keys.push_back(batch.keys[old_key]);
      from->push_back(old_key);
    }
    out.slots.push_back(renumbered[old_key]);
  }
  if (batch.multi_value()) {
    const size_t fields = static_cast<size_t>(batch.num_fields);
    out.offsets.reserve((end - begin) * fields + 1);
    for (size_t j = begin * fields; j <= end * fields; ++j) {
      out.offsets.push_back(batch.offsets[j] - slot_begin);
    }
  }
  return out;
}

BatchBuilder::BatchBuilder(int num_dense, int num_fields) {
  batch_.num_dense = num_dense;
  batch_.num_fields = num_fields;
}

uint32_t BatchBuilder::SlotOf(uint64_t id) {
  auto [it, inserted] = index_.try_emplace(id, static_cast<uint32_t>(batch_.keys.size()));
  if (inserted) batch_.keys.push_back(id);
  return it->second;
}

void BatchBuilder::Add(float label, std::span<const float> dense,
                       std::span<const uint64_t> ids) {
  CHECK_EQ(dense.size(), static_cast<size_t>(batch_.num_dense));
  CHECK_EQ(ids.size(), static_cast<size_t>(batch_.num_fields));
  batch_.labels.push_back(label);
  batch_.dense.insert(batch_.dense.end(), dense.begin(), dense.end());
  for (uint64_t id : ids) batch_.slots.push_back(SlotOf(id));
  if (batch_.multi_value()) {
    for (size_t f = 0; f < ids.size(); ++f) {
      batch_.offsets.push_back(batch_.offsets.back() + 1);
    }
  }
}

void BatchBuilder::Add(float label, std::span<const float> dense, std::span<const uint64_t> ids,
                       std::span<const uint32_t> field_ends) {
  const int num_fields = batch_.num_fields;
  CHECK_EQ(dense.size(), static_cast<size_t>(batch_.num_dense));
  CHECK_EQ(field_ends.size(), static_cast<size_t>(num_fields));
  CHECK(num_fields == 0 || field_ends.back() == ids.size());
  bool single = true;
  for (int f = 0; f < num_fields; ++f) {
    const uint32_t begin = f == 0 ? 0 : field_ends[f - 1];
    CHECK_GT(field_ends[f], begin) << "field " << f << " has no id";
    single &= field_ends[f] - begin == 1;
  }
  if (single && !batch_.multi_value()) return Add(label, dense, ids);
  if (!batch_.multi_value()) {
    // The first multi-value example: spell out the single-value ones so far.
    batch_.offsets.resize(batch_.slots.size() + 1);
    for (size_t j = 0; j < batch_.offsets.size(); ++j) batch_.offsets[j] = static_cast<uint32_t>(j);
  }
  batch_.labels.push_back(label);
  batch_.dense.insert(batch_.dense.end(), dense.begin(), dense.end());
  const uint32_t base = static_cast<uint32_t>(batch_.slots.size());
  for (uint64_t id : ids) batch_.slots.push_back(SlotOf(id));
  for (int f = 0; f < num_fields; ++f) batch_.offsets.push_back(base + field_ends[f]);
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
