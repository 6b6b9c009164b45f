// eps-keygen: makes a job's CURVE keys and HTTP token (rpc/security.h).
//
//   eps-keygen --out DIR
//
// Exit codes: 0 success, 2 usage error (or DIR already holds keys), 1
// runtime failure (one line on stderr saying what failed).

#include <cstring>
#include <iostream>
#include <string>

#include "rpc/security.h"

namespace {

constexpr char kUsage[] =
    "usage: eps-keygen --out DIR\n\n"
    "Makes an eps job's keys in DIR (created if missing):\n"
    "  DIR/public_keys   the public CURVE key of each role (master, server, worker,\n"
    "                    tool); every process of the job trusts these and no others\n"
    "  DIR/ROLE.key      each role's key pair (mode 0600)\n"
    "  DIR/http_token    the bearer token of the master's mutating HTTP endpoints\n"
    "Give every process security.keys_dir = DIR (a machine that runs only workers\n"
    "needs public_keys and worker.key). DIR must not hold keys already.\n";

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (arg.rfind("--out=", 0) == 0) {
      out = arg.substr(6);
    } else {
      std::cerr << "eps-keygen: unknown argument '" << arg << "' (see --help)\n";
      return 2;
    }
  }
  if (out.empty()) {
    std::cerr << "eps-keygen: --out DIR is required (see --help)\n";
    return 2;
  }
  const eps::Status written = eps::WriteJobKeys(out);
  if (!written.ok()) {
    std::cerr << "eps-keygen: " << written.message() << "\n";
    return absl::IsAlreadyExists(written) ? 2 : 1;
  }
  std::cout << "eps-keygen: wrote the job's keys to " << out << "\n";
  return 0;
}
