// bfloat16 on the wire: the upper 16 bits of an IEEE float32 (sign, the
// same 8-bit exponent, 7 bits of mantissa), rounded to nearest even. A
// dense tensor's rows and gradients can travel so (worker.dense_wire):
// half the bytes, the same range as float32, a relative error of at most
// 2^-8 per normal value (subnormals keep 7 bits less their leading zeros),
// finite values staying finite. The servers keep and update float32.
//
// Thread-safety: pure functions.

#ifndef EPS_RPC_BFLOAT16_H_
#define EPS_RPC_BFLOAT16_H_

#include <bit>
#include <cstdint>
#include <span>

#include "core/logging.h"

namespace eps {

inline uint16_t ToBfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // A NaN stays a NaN (rounding could carry it into infinity).
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint16_t rounded = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  // A finite value stays finite: the largest ones (over 3.39e38) would
  // round to infinity, and a gradient that was finite be refused.
  if ((rounded & 0x7fffu) == 0x7f80u && (bits & 0x7fffffffu) != 0x7f800000u) {
    return static_cast<uint16_t>(rounded - 1);
  }
  return rounded;
}

inline float FromBfloat16(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

// REQUIRES: from.size() == to.size().
inline void ToBfloat16(std::span<const float> from, std::span<uint16_t> to) {
  CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) to[i] = ToBfloat16(from[i]);
}

inline void FromBfloat16(std::span<const uint16_t> from, std::span<float> to) {
  CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) to[i] = FromBfloat16(from[i]);
}

}  // namespace eps

#endif  // EPS_RPC_BFLOAT16_H_
