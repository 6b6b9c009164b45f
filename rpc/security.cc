#include "rpc/security.h"

#include <sys/stat.h>

#include <array>
#include <filesystem>

#include <sodium.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/logging.h"

namespace eps {
namespace {

namespace fs = std::filesystem;

constexpr size_t kZ85KeyChars = 40;
constexpr size_t kKeyFileLimit = 4096;
constexpr std::array<proto::Role, 4> kRoles = {proto::ROLE_MASTER, proto::ROLE_SERVER,
                                               proto::ROLE_WORKER, proto::ROLE_TOOL};
constexpr char kPublicKeysFile[] = "public_keys";
constexpr char kHttpTokenFile[] = "http_token";
constexpr char kHowToMakeKeys[] =
    "make a job's keys with `eps-keygen --out DIR` and set security.keys_dir = DIR";

bool IsZ85Key(absl::string_view text) {
  if (text.size() != kZ85KeyChars) return false;
  std::array<uint8_t, 32> binary;
  return zmq_z85_decode(binary.data(), std::string(text).c_str()) != nullptr;
}

// A file of keys or a token, read small: refused unless a regular file (a
// FIFO would block the read forever, a device never end), and warned
// about, naming the chmod that fixes it, when users other than its owner
// may read it (`secret`: a secret key or the HTTP token).
StatusOr<std::string> ReadKeyFile(const std::string& path, bool secret) {
  struct stat info {};
  const bool stated = ::stat(path.c_str(), &info) == 0;  // else the read says why
  if (stated && !S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file: a key or token must be one"));
  }
  ASSIGN_OR_RETURN(std::string contents, ReadSmallFile(path, kKeyFileLimit));
  if (secret && stated && (info.st_mode & 0077) != 0) {
    LOG(WARNING) << path << " can be read by other users (mode "
                 << absl::StrFormat("%03o", info.st_mode & 0777) << "): chmod 600 it";
  }
  return contents;
}

// One "NAME Z85" line of a key file ("master Z85" in public_keys, "public
// Z85" in a key pair).
struct KeyLine {
  int number;  // 1-based
  std::string name;
  std::string key;
};

// The key lines of `path`; blank lines and '#' comments skipped.
StatusOr<std::vector<KeyLine>> ReadKeyLines(const std::string& path, bool secret) {
  StatusOr<std::string> contents = ReadKeyFile(path, secret);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(contents.status().message(), " (", kHowToMakeKeys, ")"));
  }
  std::vector<KeyLine> lines;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(*contents, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() != 2 || !IsZ85Key(words[1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", number, ": expected a name and a 40-character Z85 CURVE key, got '",
          line.substr(0, 80), "' (", kHowToMakeKeys, ")"));
    }
    lines.push_back({number, std::string(words[0]), std::string(words[1])});
  }
  return lines;
}

// The key pair in `path`, its public half checked against its secret one.
Status ReadKeyPair(const std::string& path, SecurityOptions* out) {
  ASSIGN_OR_RETURN(auto lines, ReadKeyLines(path, /*secret=*/true));
  for (const KeyLine& line : lines) {
    if (line.name == "public") {
      out->public_key = line.key;
    } else if (line.name == "secret") {
      out->secret_key = line.key;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line.number, ": expected 'public' or 'secret', got '", line.name, "'"));
    }
  }
  if (out->public_key.empty() || out->secret_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " lacks its 'public' or 'secret' line (", kHowToMakeKeys, ")"));
  }
  std::array<char, kZ85KeyChars + 1> derived{};
  if (zmq_curve_public(derived.data(), out->secret_key.c_str()) != 0 ||
      out->public_key != derived.data()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": its public key is not the one of its secret key"));
  }
  return absl::OkStatus();
}

// The token in `path`: its first line, at least 16 characters.
StatusOr<std::string> ReadHttpToken(const std::string& path) {
  StatusOr<std::string> contents = ReadKeyFile(path, /*secret=*/true);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("security.http_token_file: ",
                                                   contents.status().message()));
  }
  const std::string token(absl::StripAsciiWhitespace(
      absl::string_view(*contents).substr(0, contents->find('\n'))));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "security.http_token_file: ", path, " holds no token of at least 16 characters"));
  }
  return token;
}

}  // namespace

const char* RoleName(proto::Role role) {
  switch (role) {
    case proto::ROLE_MASTER: return "master";
    case proto::ROLE_SERVER: return "server";
    case proto::ROLE_WORKER: return "worker";
    case proto::ROLE_TOOL: return "tool";
    default: return "unknown";
  }
}

std::optional<proto::Role> RoleFromName(absl::string_view name) {
  for (proto::Role role : kRoles) {
    if (name == RoleName(role)) return role;
  }
  return std::nullopt;
}

std::optional<proto::Role> SecurityOptions::RoleOf(absl::string_view z85) const {
  for (const auto& [key, role] : trusted) {
    if (key == z85) return role;
  }
  return std::nullopt;
}

StatusOr<SecurityOptions> LoadSecurity(const JobConfig::Security& config, proto::Role role) {
  const std::string& mode = config.mode;
  const std::string& keys_dir = config.keys_dir;
  SecurityOptions security;
  if (mode == "off") {
    LOG(WARNING) << "security.mode = off: this " << RoleName(role)
                 << " is UNAUTHENTICATED and unencrypted; anyone who reaches the job's ports can "
                    "act on it (make keys with eps-keygen and set security.keys_dir)";
    if (!config.http_token_file.empty()) {
      ASSIGN_OR_RETURN(security.http_token, ReadHttpToken(config.http_token_file));
    }
    return security;
  }
  if (mode != "curve") {
    return absl::InvalidArgumentError(
        absl::StrCat("security.mode = ", mode, ": expected curve or off"));
  }
  if (keys_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "security.mode = curve (the default) needs security.keys_dir: ", kHowToMakeKeys,
        ", or set security.mode = off to run a job anyone who reaches its ports can control"));
  }
  if (zmq_has("curve") == 0) {
    return absl::InvalidArgumentError(
        "security.mode = curve, but this libzmq was built without CURVE");
  }
  security.curve = true;
  security.role = role;
  const std::string public_keys = (fs::path(keys_dir) / kPublicKeysFile).string();
  ASSIGN_OR_RETURN(std::vector<KeyLine> lines, ReadKeyLines(public_keys, /*secret=*/false));
  // Where the secret keys live: others should not even list it.
  if (struct stat info; ::stat(keys_dir.c_str(), &info) == 0 && (info.st_mode & 0077) != 0) {
    LOG(WARNING) << "security.keys_dir " << keys_dir << " can be entered by other users (mode "
                 << absl::StrFormat("%03o", info.st_mode & 0777) << "): chmod 700 it";
  }
  for (const KeyLine& line : lines) {
    std::optional<proto::Role> named = RoleFromName(line.name);
    if (!named.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(public_keys, ":", line.number, ": unknown role '", line.name,
                       "' (expected master, server, worker or tool)"));
    }
    std::string* serving = *named == proto::ROLE_MASTER   ? &security.master_key
                           : *named == proto::ROLE_SERVER ? &security.server_key
                                                          : nullptr;
    if (serving != nullptr) {
      if (!serving->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            public_keys, ":", line.number, ": a second ", line.name,
            " key (every process of a serving role shares one key pair)"));
      }
      *serving = line.key;
    }
    security.trusted.push_back({line.key, *named});
  }
  if (security.master_key.empty() || security.server_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(public_keys, " lists no master or no server key (", kHowToMakeKeys, ")"));
  }
  const std::string own = (fs::path(keys_dir) / absl::StrCat(RoleName(role), ".key")).string();
  RETURN_IF_ERROR(ReadKeyPair(own, &security));
  if (security.RoleOf(security.public_key) != role) {
    return absl::InvalidArgumentError(absl::StrCat(
        own, ": its public key is not listed as the ", RoleName(role), "'s in ", public_keys,
        " (keys of two eps-keygen runs mixed?)"));
  }
  if (role == proto::ROLE_MASTER) {
    ASSIGN_OR_RETURN(security.http_token,
                     ReadHttpToken(config.http_token_file.empty()
                                       ? (fs::path(keys_dir) / kHttpTokenFile).string()
                                       : config.http_token_file));
  }
  return security;
}

Status WriteJobKeys(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  const fs::path public_keys = fs::path(dir) / kPublicKeysFile;
  if (fs::exists(public_keys)) {
    return absl::AlreadyExistsError(absl::StrCat(
        public_keys.string(), " exists: ", dir,
        " holds a job's keys already (remove it first to make new ones)"));
  }
  // The secret keys' directory is its owner's alone.
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot chmod 700 ", dir, ": ", error.message()));
  }
  std::string listed =
      "# The CURVE public keys of an eps job, one per role (eps-keygen).\n"
      "# Every process of the job trusts these and no others.\n";
  for (proto::Role role : kRoles) {
    std::array<char, kZ85KeyChars + 1> public_key{};
    std::array<char, kZ85KeyChars + 1> secret_key{};
    if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot make a CURVE key pair: ", zmq_strerror(zmq_errno())));
    }
    const std::string pair = absl::StrCat("# The ", RoleName(role),
                                          "'s CURVE key pair (eps-keygen). Keep it secret.\n",
                                          "public ", public_key.data(), "\nsecret ",
                                          secret_key.data(), "\n");
    RETURN_IF_ERROR(WriteFileAtomically(
        (fs::path(dir) / absl::StrCat(RoleName(role), ".key")).string(), pair, 0600));
    absl::StrAppend(&listed, RoleName(role), " ", public_key.data(), "\n");
  }
  // The token: 32 random bytes in hex, so that no HTTP library decodes it
  // on the way (Z85 text has '%').
  RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / kHttpTokenFile).string(),
                                      absl::StrCat(NewSecret(), "\n"), 0600));
  // Last, so that a directory with public_keys is complete.
  return WriteFileAtomically(public_keys.string(), listed, 0644);
}

proto::Role ServingRole(proto::Method method) {
  return method < 32 ? proto::ROLE_MASTER : proto::ROLE_SERVER;
}

StatusOr<WorkerCredentials> WorkerCredentials::ForMaster(const SecurityOptions& security) {
  if (sodium_init() < 0) return absl::InternalError("libsodium cannot start");
  std::array<uint8_t, 32> secret;
  if (!security.curve || security.role != proto::ROLE_MASTER ||
      security.secret_key.size() != kZ85KeyChars ||
      zmq_z85_decode(secret.data(), security.secret_key.c_str()) == nullptr) {
    return absl::InvalidArgumentError("worker credentials need the master's CURVE secret key");
  }
  // A key of its own, so that a credential reveals nothing of the CURVE key.
  constexpr absl::string_view kPurpose = "eps worker credentials v1";
  std::string key(crypto_auth_KEYBYTES, '\0');
  crypto_generichash(reinterpret_cast<unsigned char*>(key.data()), key.size(),
                     reinterpret_cast<const unsigned char*>(kPurpose.data()), kPurpose.size(),
                     secret.data(), secret.size());
  sodium_memzero(secret.data(), secret.size());
  return WorkerCredentials(std::move(key));
}

StatusOr<WorkerCredentials> WorkerCredentials::FromKey(absl::string_view key) {
  if (sodium_init() < 0) return absl::InternalError("libsodium cannot start");
  if (key.size() != crypto_auth_KEYBYTES) {
    return absl::InvalidArgumentError(absl::StrCat("a worker credential key has ",
                                                   crypto_auth_KEYBYTES, " bytes, not ",
                                                   key.size()));
  }
  return WorkerCredentials(std::string(key));
}

std::string WorkerCredentials::Tag(absl::string_view message) const {
  std::string tag(crypto_auth_BYTES, '\0');
  crypto_auth(reinterpret_cast<unsigned char*>(tag.data()),
              reinterpret_cast<const unsigned char*>(message.data()), message.size(),
              reinterpret_cast<const unsigned char*>(key_.data()));
  return tag;
}

std::string WorkerCredentials::Issue(uint32_t id) const {
  // The id alone, little-endian: the credentials' own domain.
  const char message[4] = {static_cast<char>(id), static_cast<char>(id >> 8),
                           static_cast<char>(id >> 16), static_cast<char>(id >> 24)};
  return Tag(absl::string_view(message, sizeof(message)));
}

bool WorkerCredentials::Verify(uint32_t id, absl::string_view credential) const {
  return SameSecret(Issue(id), credential);
}

std::string WorkerCredentials::ServerCredential(uint32_t slot) const {
  std::string message = "eps server slot v1";
  for (int i = 0; i < 4; ++i) message.push_back(static_cast<char>(slot >> (8 * i)));
  return Tag(message);
}

bool WorkerCredentials::VerifyServer(uint32_t slot, absl::string_view credential) const {
  return SameSecret(ServerCredential(slot), credential);
}

std::string NewSecret() {
  CHECK_GE(sodium_init(), 0) << "libsodium cannot start";
  unsigned char bytes[32];
  randombytes_buf(bytes, sizeof(bytes));
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

bool SameSecret(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string WorkerCredentials::Receipt(uint32_t id, const proto::WorkBatch& batch) const {
  // A fixed layout: the domain, then every field little-endian.
  std::string message = "eps push receipt v1";
  const auto append = [&message](uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) message.push_back(static_cast<char>(value >> (8 * i)));
  };
  append(id, 4);
  append(batch.shard_id(), 8);
  append(batch.epoch(), 4);
  append(batch.begin_offset(), 8);
  append(batch.end_offset(), 8);
  append(batch.records(), 4);
  return Tag(message);
}

bool WorkerCredentials::VerifyReceipt(uint32_t id, const proto::WorkBatch& batch,
                                      absl::string_view tag) const {
  return SameSecret(Receipt(id, batch), tag);
}

StatusOr<std::unique_ptr<ZapAuthenticator>> ZapAuthenticator::Start(
    zmq::context_t& context, const SecurityOptions& security) {
  std::unique_ptr<ZapAuthenticator> zap(new ZapAuthenticator(security));
  zmq::socket_t socket;
  try {
    socket = zmq::socket_t(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::rcvtimeo, 100);
    socket.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("cannot start the ZAP handler: ", e.what()));
  }
  zap->thread_ = std::thread(
      [z = zap.get(), s = std::move(socket)]() mutable { z->Loop(std::move(s)); });
  return zap;
}

ZapAuthenticator::~ZapAuthenticator() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapAuthenticator::Loop(zmq::socket_t socket) {
  // Addresses whose refusal was logged (bounded: an attacker can use many).
  constexpr size_t kMaxLogged = 1024;
  absl::flat_hash_set<std::string> logged;
  std::vector<zmq::message_t> request;
  while (!stopping_.load(std::memory_order_relaxed)) {
    request.clear();
    try {
      zmq::message_t frame;
      if (!socket.recv(frame).has_value()) continue;  // timeout: look at stopping_
      request.push_back(std::move(frame));
      while (request.back().more()) {
        zmq::message_t next;
        (void)socket.recv(next);
        request.push_back(std::move(next));
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      if (e.num() != ETERM) LOG(ERROR) << "ZAP handler stopped: " << e.what();
      return;
    }
    // version, request id, domain, address, routing id, mechanism, key.
    std::string status = "400";
    std::string text = "no key the job trusts";
    std::string user;
    std::string address = request.size() > 3 ? request[3].to_string() : "?";
    if (request.size() == 7 && request[5].to_string_view() == "CURVE" &&
        request[6].size() == 32) {
      std::array<char, kZ85KeyChars + 1> z85{};
      zmq_z85_encode(z85.data(), static_cast<const uint8_t*>(request[6].data()), 32);
      if (std::optional<proto::Role> role = security_.RoleOf(z85.data())) {
        status = "200";
        text = "OK";
        user = RoleName(*role);
      }
    } else if (request.size() > 5) {
      text = absl::StrCat("mechanism ", request[5].to_string(), " is not CURVE");
    }
    if (status != "200") {
      refused_.fetch_add(1, std::memory_order_relaxed);
      if (logged.size() < kMaxLogged && logged.insert(address).second) {
        LOG(WARNING) << "refused a connection from " << address << ": " << text
                     << " (logged once per address)";
      }
    }
    std::vector<zmq::message_t> reply;
    reply.emplace_back(std::string_view("1.0"));
    reply.push_back(request.size() > 1 ? std::move(request[1]) : zmq::message_t());
    reply.emplace_back(std::string_view(status));
    reply.emplace_back(std::string_view(text));
    reply.emplace_back(std::string_view(user));
    reply.emplace_back();
    try {
      for (size_t i = 0; i < reply.size(); ++i) {
        (void)socket.send(reply[i],
                          i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() != ETERM) LOG(ERROR) << "ZAP handler cannot reply: " << e.what();
      return;
    }
  }
}

}  // namespace eps
