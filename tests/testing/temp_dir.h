// TempDir: a fresh directory under the test temp dir, removed with its
// contents when the object goes away; and FreeLoopbackPort, for a server a
// test starts that cannot take port 0 itself.
//
// Thread-safety: a value owned by one test.

#ifndef EPS_TESTS_TESTING_TEMP_DIR_H_
#define EPS_TESTS_TESTING_TEMP_DIR_H_

#include <string>

namespace eps::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A TCP port free on 127.0.0.1 now (the kernel's pick, released at once);
// 0 when none could be had.
int FreeLoopbackPort();

}  // namespace eps::testing

#endif  // EPS_TESTS_TESTING_TEMP_DIR_H_
