#include "tests/testing/raw_npy.h"

#include <filesystem>
#include <fstream>

namespace eps::testing {

void WriteRawNpy(const std::string& path, int version, uint32_t claimed_header,
                 const std::string& header, size_t data_bytes) {
  std::filesystem::remove(path);  // it may be a link or a FIFO a test made
  std::string bytes("\x93NUMPY", 6);
  bytes += static_cast<char>(version);
  bytes += '\0';
  const int length_bytes = version == 1 ? 2 : 4;
  for (int i = 0; i < length_bytes; ++i) {
    bytes += static_cast<char>((claimed_header >> (8 * i)) & 0xff);
  }
  bytes += header;
  bytes.append(data_bytes, '\0');
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace eps::testing
