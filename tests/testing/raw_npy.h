// WriteRawNpy: a .npy file as a hostile writer makes it, for tests of the
// readers that must refuse one (core/npy.h, cluster/model_format.h,
// eps-predict, a warm start): its header length field says what the test
// wants, true or not.
//
// Thread-safety: a function of its arguments; it writes only `path`.

#ifndef EPS_TESTS_TESTING_RAW_NPY_H_
#define EPS_TESTS_TESTING_RAW_NPY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace eps::testing {

// Writes (replacing) `path`: the .npy magic, format `version` (1: a 2-byte
// header length, 2 or 3: 4 bytes) whose length field says `claimed_header`,
// then `header`, then `data_bytes` zero bytes.
void WriteRawNpy(const std::string& path, int version, uint32_t claimed_header,
                 const std::string& header, size_t data_bytes);

}  // namespace eps::testing

#endif  // EPS_TESTS_TESTING_RAW_NPY_H_
