#include "master/drains.h"

namespace eps {

Drains::State Drains::state(uint32_t slot) const {
  auto it = slots_.find(slot);
  return it == slots_.end() ? State::kNone : it->second;
}

std::set<uint32_t> Drains::leaving() const {
  std::set<uint32_t> slots;
  for (const auto& [slot, state] : slots_) slots.insert(slot);
  return slots;
}

std::set<uint32_t> Drains::drained() const {
  std::set<uint32_t> slots;
  for (const auto& [slot, state] : slots_) {
    if (state == State::kDrained) slots.insert(slot);
  }
  return slots;
}

std::optional<uint32_t> Drains::FirstDraining() const {
  for (const auto& [slot, state] : slots_) {
    if (state == State::kDraining) return slot;
  }
  return std::nullopt;
}

bool Drains::Start(uint32_t slot) { return slots_.emplace(slot, State::kDraining).second; }

bool Drains::Emptied(uint32_t slot) {
  auto it = slots_.find(slot);
  if (it == slots_.end() || it->second != State::kDraining) return false;
  it->second = State::kDrained;
  return true;
}

void Drains::Refilled(uint32_t slot) {
  auto it = slots_.find(slot);
  if (it != slots_.end()) it->second = State::kDraining;
}

bool Drains::Stop(uint32_t slot) { return slots_.erase(slot) > 0; }

void Drains::SaveTo(proto::MasterRecord* record) const {
  for (const auto& [slot, state] : slots_) record->add_draining_servers(slot);
}

void Drains::RestoreFrom(const proto::MasterRecord& record) {
  for (uint32_t slot : record.draining_servers()) slots_[slot] = State::kDraining;
}

}  // namespace eps
