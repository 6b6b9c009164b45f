// The byte layout of the fuzz targets' chunked inputs, shared with the seed
// generator (fuzz/make_corpus.cc) so that seeds and targets agree. Every
// target also links fuzz_support.cc, which quiets the logs.
//
// A chunked input is a sequence of chunks, each a 2-byte little-endian
// length followed by that many bytes; a length running past the end takes
// what is left, so every byte string splits into some chunks.
//
// Thread-safety: functions of their arguments; safe for concurrent use.

#ifndef EPS_FUZZ_FUZZ_SUPPORT_H_
#define EPS_FUZZ_FUZZ_SUPPORT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace eps::fuzz {

inline std::vector<absl::string_view> SplitChunks(absl::string_view data) {
  std::vector<absl::string_view> chunks;
  while (data.size() >= 2) {
    const size_t length = static_cast<uint8_t>(data[0]) | (static_cast<uint8_t>(data[1]) << 8);
    data.remove_prefix(2);
    const size_t taken = std::min(length, data.size());
    chunks.push_back(data.substr(0, taken));
    data.remove_prefix(taken);
  }
  return chunks;
}

// Appends `chunk` to `out` as SplitChunks reads it back.
// REQUIRES: chunk.size() < 65536.
inline void AppendChunk(absl::string_view chunk, std::string* out) {
  out->push_back(static_cast<char>(chunk.size() & 0xff));
  out->push_back(static_cast<char>(chunk.size() >> 8));
  out->append(chunk.data(), chunk.size());
}

}  // namespace eps::fuzz

#endif  // EPS_FUZZ_FUZZ_SUPPORT_H_
