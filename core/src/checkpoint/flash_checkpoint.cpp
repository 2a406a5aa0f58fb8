#include "strata/core/flash_checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <ATen/ATen.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sha256.h"
#include "strata/errors.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'F', 'L', 'S', 'H', '1'};
constexpr uint64_t kHeaderBytes = 4096;  // the image starts page-aligned

struct SlotHeader {
  char magic[8];
  int32_t state;  // FlashSlotState, changed atomically
  int32_t rank;
  int64_t step;
  int64_t world_size;
  uint64_t image_bytes;
  uint64_t checksum;
  char state_hash[80];  // NUL-terminated
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

int32_t load_state(const SlotHeader* h) { return __atomic_load_n(&h->state, __ATOMIC_ACQUIRE); }
void store_state(SlotHeader* h, FlashSlotState s) { __atomic_store_n(&h->state, static_cast<int32_t>(s), __ATOMIC_RELEASE); }
bool swap_state(SlotHeader* h, int32_t expected, FlashSlotState desired) {
  return __atomic_compare_exchange_n(&h->state, &expected, static_cast<int32_t>(desired), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

fs::path slot_path(const fs::path& dir, int rank, int slot) { return dir / ("rank_" + std::to_string(rank) + "." + std::to_string(slot)); }

// A slot file mapped whole; read-write or read-only.
class Mapping {
 public:
  Mapping(const fs::path& path, bool writable) {
    const int fd = ::open(path.c_str(), writable ? O_RDWR : O_RDONLY);
    if (fd < 0) throw UserError("cannot open " + path.string() + ": " + std::strerror(errno));
    struct stat info {};
    if (::fstat(fd, &info) != 0 || static_cast<uint64_t>(info.st_size) < kHeaderBytes) {
      ::close(fd);
      throw UserError(path.string() + " is not a flash snapshot slot (too short)");
    }
    size_ = static_cast<size_t>(info.st_size);
    void* map = ::mmap(nullptr, size_, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) throw UserError("cannot map " + path.string() + ": " + std::strerror(errno));
    data_ = static_cast<char*>(map);
  }
  ~Mapping() { ::munmap(data_, size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  SlotHeader* header() const { return reinterpret_cast<SlotHeader*>(data_); }
  // The image, or empty when the header claims more than the file holds.
  std::string_view image() const {
    const uint64_t bytes = header()->image_bytes;
    if (bytes > size_ - kHeaderBytes) return {};
    return {data_ + kHeaderBytes, static_cast<size_t>(bytes)};
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// The header alone, read with one system call (scanning never maps the images).
bool read_header(const fs::path& path, SlotHeader& out) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool whole = ::pread(fd, &out, sizeof out, 0) == static_cast<ssize_t>(sizeof out);
  ::close(fd);
  return whole && std::memcmp(out.magic, kMagic, sizeof kMagic) == 0;
}

bool holds_snapshot(int32_t state) {
  return state == static_cast<int32_t>(FlashSlotState::Valid) || state == static_cast<int32_t>(FlashSlotState::Persisting);
}

uint64_t rotate(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Copies into the slot with non-temporal stores: the snapshot is not read again by this rank
// soon, so writing around the cache saves reading each destination line first (memcpy's stores
// below glibc's size threshold, which a checkpoint's tensors are, do). 168 MiB into /dev/shm on
// this machine: 12 ms against memcpy's 17 ms. SSE2 is in every x86-64; elsewhere, memcpy.
void stream_copy(char* dst, const char* src, size_t n) {
#if defined(__x86_64__)
  const size_t head = std::min(n, static_cast<size_t>((16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16));
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  const size_t body = n - n % 16;
  for (size_t i = 0; i < body; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  _mm_sfence();  // the streamed lines are visible before the slot's state says they are there
  std::memcpy(dst + body, src + body, n - body);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace

uint64_t flash_checksum(const void* data, size_t bytes) {
  // Four independent lanes, each a multiply-rotate-multiply round per 8 bytes (the round of the
  // published xxHash64 design), so the core keeps four multiplies in flight.
  constexpr uint64_t p1 = 0x9E3779B185EBCA87ULL, p2 = 0xC2B2AE3D27D4EB4FULL, p3 = 0x165667B19E3779F9ULL;
  uint64_t lane[4] = {p1 + p2, p2, 0, 0 - p1};
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, p + i + 8 * k, 8);
      lane[k] = rotate(lane[k] + word * p2, 31) * p1;
    }
  uint64_t h = rotate(lane[0], 1) + rotate(lane[1], 7) + rotate(lane[2], 12) + rotate(lane[3], 18) + bytes;
  for (; i < bytes; ++i) h = rotate(h ^ (p[i] * p3), 11) * p1;
  h ^= h >> 33, h *= p2, h ^= h >> 29, h *= p3, h ^= h >> 32;
  return h;
}

fs::path flash_directory(const fs::path& run_dir) {
  Sha256 hash;
  const std::string absolute = fs::absolute(run_dir).lexically_normal().string();
  hash.update(absolute.data(), absolute.size());
  const std::string name = "strata-flash-" + hash.hex_digest().substr(0, 16);
  std::error_code ec;
  return fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") / name : fs::temp_directory_path() / name;
}

fs::path flash_node_store(const fs::path& flash_dir, int node) { return flash_dir / ("node_" + std::to_string(node)); }

fs::path breakpoint_persist_marker(const fs::path& flash_dir) { return flash_dir / ".persisting"; }

bool wait_for_breakpoint_persist(const fs::path& flash_dir, double timeout_s) {
  const fs::path marker = breakpoint_persist_marker(flash_dir);
  const auto started = std::chrono::steady_clock::now();
  bool waited = false;
  std::error_code ec;
  while (fs::exists(marker, ec) && std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() < timeout_s) {
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return waited;
}

namespace {

// `dir` and the node stores inside it.
std::vector<fs::path> stores_in(const fs::path& dir) {
  std::vector<fs::path> out{dir};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory() && entry.path().filename().string().rfind("node_", 0) == 0) out.push_back(entry.path());
  return out;
}

}  // namespace

// ---- the rank's side ----

struct FlashWriter::Slot {
  fs::path path;
  char* data = nullptr;
  size_t size = 0;
  SlotHeader* header() const { return reinterpret_cast<SlotHeader*>(data); }
  ~Slot() {
    if (data) ::munmap(data, size);
  }
};

FlashWriter::FlashWriter(fs::path dir, int rank) : dir_(std::move(dir)), rank_(rank) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  for (int s = 0; s < 2; ++s) {
    slots_[s] = std::make_unique<Slot>();
    slots_[s]->path = slot_path(dir_, rank_, s);
  }
}

FlashWriter::~FlashWriter() { wait(); }

void FlashWriter::wait() {
  if (checksum_.joinable()) checksum_.join();
  checking_ = -1;
}

// Maps the slot with room for `bytes` of image: an existing file as it is when big enough (its
// header keeps its state), else grown. The pages are reserved with posix_fallocate, so a full
// /dev/shm is an error here rather than SIGBUS in the copy. `populate`: the pages are also mapped
// in now (a snapshot's own slots, whose copy blocks the step either way); a replica's slots are
// not, so the first touch of each page happens in the communicator's receiving thread, in the
// background, rather than in the blocking part of posting (measured 350-640 ms once per run for
// 2 x 168.5 MiB).
bool FlashWriter::prepare(Slot& slot, uint64_t bytes, std::string& problem, bool populate) {
  const uint64_t needed = kHeaderBytes + bytes;
  if (slot.data && slot.size >= needed) return true;
  if (slot.data) ::munmap(slot.data, slot.size), slot.data = nullptr;
  const int fd = ::open(slot.path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) {
    problem = "cannot create " + slot.path.string() + ": " + std::strerror(errno);
    return false;
  }
  struct stat info {};
  ::fstat(fd, &info);
  // Room for the image to grow a little (metadata text) without re-mapping.
  const uint64_t size = std::max<uint64_t>(static_cast<uint64_t>(info.st_size), needed + needed / 64 + 4096);
  if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); error != 0) {
    ::close(fd);
    problem = "shared memory cannot hold " + std::to_string(size >> 20) + " MiB at " + slot.path.string() + ": " + std::strerror(error);
    return false;
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    problem = "cannot map " + slot.path.string() + ": " + std::strerror(errno);
    return false;
  }
  slot.data = static_cast<char*>(map);
  slot.size = size;
  if (std::memcmp(slot.header()->magic, kMagic, sizeof kMagic) != 0) {  // a new file
    std::memset(slot.data, 0, sizeof(SlotHeader));
    std::memcpy(slot.header()->magic, kMagic, sizeof kMagic);
  }
  return true;
}

// Takes the older slot for an image of `bytes` (one holding no snapshot, or one of a step not
// before this one, counts as oldest) and fills its header; -1 when the supervisor holds it, or
// takes it between the look and the swap: the newest snapshot stays whole.
int FlashWriter::take_older_slot(const FlashImageInfo& info, uint64_t bytes) {
  // A slot whose checksum is still being computed (a replica being checked) counts as holding one.
  auto age = [&](const SlotHeader* h) {
    const int32_t state = load_state(h);
    const bool holds = holds_snapshot(state) || state == static_cast<int32_t>(FlashSlotState::Checksumming);
    return holds && h->step < info.step ? h->step : -1;
  };
  int target = age(slots_[0]->header()) <= age(slots_[1]->header()) ? 0 : 1;
  if (target == checking_) target = 1 - target;  // never the slot a replica check is reading
  SlotHeader* h = slots_[target]->header();
  const int32_t state = load_state(h);
  if (state == static_cast<int32_t>(FlashSlotState::Persisting) || !swap_state(h, state, FlashSlotState::Writing)) return -1;
  h->rank = rank_;
  h->step = info.step;
  h->world_size = info.world_size;
  h->image_bytes = bytes;
  std::snprintf(h->state_hash, sizeof h->state_hash, "%s", info.state_hash.c_str());
  return target;
}

FlashWrite FlashWriter::write(const FlashImageInfo& info, const NamedTensors& tensors, const Metadata& metadata, std::string& problem,
                              const std::function<void()>& halfway) {
  wait();
  const std::string prefix = safetensors_prefix(tensors, metadata);
  uint64_t bytes = prefix.size();
  for (const auto& [name, tensor] : tensors) bytes += static_cast<uint64_t>(tensor.nbytes());
  for (auto& slot : slots_)
    if (!prepare(*slot, bytes, problem, /*populate=*/true)) return FlashWrite::Failed;
  const int target = take_older_slot(info, bytes);
  if (target < 0) return FlashWrite::Skipped;
  Slot& slot = *slots_[target];
  SlotHeader* h = slot.header();
  char* out = slot.data + kHeaderBytes;
  std::memcpy(out, prefix.data(), prefix.size());
  out += prefix.size();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i].second;
    const size_t n = t.nbytes();
    if (t.device().is_cpu() && t.is_contiguous())
      stream_copy(out, static_cast<const char*>(t.data_ptr()), n);
    else if (n > 0)
      at::from_blob(out, t.sizes(), at::TensorOptions().dtype(t.scalar_type())).copy_(t);
    out += n;
    if (halfway && i + 1 == tensors.size() / 2) halfway();
  }
  store_state(h, FlashSlotState::Checksumming);
  newest_ = target;
  checksum_ = std::thread([h, image = slot.data + kHeaderBytes, bytes] {
    h->checksum = flash_checksum(image, bytes);
    store_state(h, FlashSlotState::Valid);
  });
  return FlashWrite::Written;
}

std::optional<FlashImageView> FlashWriter::newest(bool with_checksum) {
  if (with_checksum) wait();
  if (newest_ < 0) return std::nullopt;
  const SlotHeader* h = slots_[newest_]->header();
  const int32_t state = load_state(h);
  if (!holds_snapshot(state) && state != static_cast<int32_t>(FlashSlotState::Checksumming)) return std::nullopt;
  return FlashImageView{{h->step, h->world_size, h->state_hash}, with_checksum ? h->checksum : 0,
                        {slots_[newest_]->data + kHeaderBytes, static_cast<size_t>(h->image_bytes)}};
}

FlashReceive FlashWriter::begin_receive(const FlashImageInfo& info, uint64_t bytes, std::string& problem) {
  // No wait for the check of the previous replica: it runs on in its slot, and the other is taken.
  for (int s = 0; s < 2; ++s)
    if (s != checking_ && !prepare(*slots_[s], bytes, problem, /*populate=*/false)) return {};
  const int target = take_older_slot(info, bytes);
  return target < 0 ? FlashReceive{} : FlashReceive{slots_[target]->data + kHeaderBytes, target};
}

void FlashWriter::finish_receive(const FlashReceive& receive, uint64_t checksum) {
  if (!receive.image) return;
  wait();
  SlotHeader* h = slots_[receive.slot]->header();
  h->checksum = checksum;  // the sender's
  store_state(h, FlashSlotState::Valid);
  newest_ = receive.slot;
}

void FlashWriter::check_newest_receive() {
  wait();
  if (newest_ < 0) return;
  checking_ = newest_;
  SlotHeader* h = slots_[newest_]->header();
  checksum_ = std::thread([h, image = reinterpret_cast<char*>(h) + kHeaderBytes] {
    // Bytes that do not match the sender's checksum stop counting (unless the supervisor holds
    // the slot: it checks every image itself before persisting).
    if (flash_checksum(image, h->image_bytes) != h->checksum) swap_state(h, static_cast<int32_t>(FlashSlotState::Valid), FlashSlotState::Empty);
  });
}

void FlashWriter::discard_after(int64_t step) {
  wait();
  for (auto& slot : slots_) {
    SlotHeader h{};
    if (!read_header(slot->path, h) || h.step <= step) continue;
    const Mapping map(slot->path, /*writable=*/true);
    const int32_t state = load_state(map.header());
    if (state != static_cast<int32_t>(FlashSlotState::Persisting)) swap_state(map.header(), state, FlashSlotState::Empty);
  }
}

void FlashWriter::damage_newest() {
  wait();
  if (newest_ < 0) return;
  slots_[newest_]->data[kHeaderBytes + slots_[newest_]->header()->image_bytes / 2] ^= 0x40;
}

// ---- reading, for restarts and the supervisor ----

std::vector<FlashImageRef> flash_images(const fs::path& dir) {
  std::vector<FlashImageRef> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    SlotHeader h{};
    if (!entry.is_regular_file() || !read_header(entry.path(), h) || !holds_snapshot(h.state)) continue;
    h.state_hash[sizeof h.state_hash - 1] = '\0';
    out.push_back({{h.step, h.world_size, h.state_hash}, h.rank, entry.path()});
  }
  return out;
}

std::vector<FlashSet> complete_flash_sets(const fs::path& dir) {
  // (step, world, hash) -> rank -> slot file
  std::map<std::tuple<int64_t, int64_t, std::string>, std::map<int, fs::path>> found;
  for (const fs::path& store : stores_in(dir))
    for (const FlashImageRef& image : flash_images(store))
      found[{image.info.step, image.info.world_size, image.info.state_hash}][image.rank] = image.slot;
  std::vector<FlashSet> out;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const auto& [key, ranks] = *it;
    const auto& [step, world, hash] = key;
    if (world < 1 || static_cast<int64_t>(ranks.size()) != world) continue;
    FlashSet set{{step, world, hash}, {}};
    for (int r = 0; r < world; ++r) {
      auto slot = ranks.find(r);
      if (slot == ranks.end()) break;
      set.slots.push_back(slot->second);
    }
    if (static_cast<int64_t>(set.slots.size()) == world) out.push_back(std::move(set));
  }
  return out;
}

std::optional<std::string> flash_slot_problem(const fs::path& slot) {
  try {
    const Mapping map(slot, /*writable=*/false);
    const std::string_view image = map.image();
    if (image.empty()) return slot.string() + " claims more bytes than it holds";
    if (flash_checksum(image.data(), image.size()) != map.header()->checksum)
      return "the snapshot of rank " + std::to_string(map.header()->rank) + " at step " + std::to_string(map.header()->step) +
             " fails its checksum";
  } catch (const UserError& e) {
    return e.what();
  }
  return std::nullopt;
}

void release_flash_slots(const fs::path& dir) {
  for (const fs::path& store : stores_in(dir)) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(store, ec)) {
      SlotHeader h{};
      if (!entry.is_regular_file() || !read_header(entry.path(), h)) continue;
      if (h.state != static_cast<int32_t>(FlashSlotState::Persisting)) continue;
      const Mapping map(entry.path(), /*writable=*/true);
      store_state(map.header(), FlashSlotState::Valid);
    }
  }
}

MappedFlashSet map_flash_set(const FlashSet& set) { return map_flash_slots(set.slots); }

MappedFlashSet map_flash_slots(const std::vector<fs::path>& slots) {
  auto maps = std::make_shared<std::vector<std::unique_ptr<Mapping>>>();
  MappedFlashSet out;
  for (const auto& slot : slots) {
    maps->push_back(std::make_unique<Mapping>(slot, /*writable=*/false));
    out.images.push_back(maps->back()->image());
  }
  out.mappings = maps;
  return out;
}

uint64_t persist_flash_set(const FlashSet& set, const fs::path& checkpoints_dir, int64_t keep, double pause_seconds) {
  std::vector<std::unique_ptr<Mapping>> held;
  // Releases whatever was held, on every way out.
  struct Release {
    std::vector<std::unique_ptr<Mapping>>& held;
    ~Release() {
      for (auto& m : held) store_state(m->header(), FlashSlotState::Valid);
    }
  } release{held};
  // Hold every slot first (a swap each), so ranks skip rather than overwrite while the set is
  // checked and written; then check the checksums.
  for (size_t r = 0; r < set.slots.size(); ++r) {
    auto map = std::make_unique<Mapping>(set.slots[r], /*writable=*/true);
    SlotHeader* h = map->header();
    if (!swap_state(h, static_cast<int32_t>(FlashSlotState::Valid), FlashSlotState::Persisting))
      throw FlashSetChanged("rank " + std::to_string(r) + " is overwriting its snapshot of step " + std::to_string(set.info.step));
    held.push_back(std::move(map));
    // Held now; the step may have changed between the scan and the hold.
    if (h->step != set.info.step || h->world_size != set.info.world_size)
      throw FlashSetChanged("rank " + std::to_string(r) + " replaced its snapshot of step " + std::to_string(set.info.step));
  }
  for (size_t r = 0; r < held.size(); ++r) {
    const std::string_view image = held[r]->image();
    if (image.empty() || flash_checksum(image.data(), image.size()) != held[r]->header()->checksum)
      throw UserError("the snapshot of rank " + std::to_string(r) + " at step " + std::to_string(set.info.step) + " fails its checksum");
  }
  fs::create_directories(checkpoints_dir);
  engine::remove_stale_staging(checkpoints_dir);
  const fs::path staging = engine::staging_dir(checkpoints_dir, set.info.step);
  fs::create_directories(staging);
  std::vector<engine::CheckpointFile> files;
  uint64_t total = 0;
  for (size_t r = 0; r < held.size(); ++r) {
    const std::string_view image = held[r]->image();
    const std::string name = engine::shard_name(static_cast<int>(r));
    const fs::path path = staging / name;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw UserError("cannot write " + path.string() + ": " + std::strerror(errno));
    // Hash and write in the same pass over the image, a chunk at a time.
    Sha256 hash;
    constexpr size_t kChunk = 8 << 20;
    for (size_t at = 0; at < image.size();) {
      const size_t n = std::min(kChunk, image.size() - at);
      hash.update(image.data() + at, n);
      for (size_t done = 0; done < n;) {
        const ssize_t w = ::write(fd, image.data() + at + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          const int error = errno;
          ::close(fd);
          throw UserError("cannot write " + path.string() + ": " + std::strerror(error));
        }
        done += static_cast<size_t>(w);
      }
      at += n;
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) throw UserError("cannot write " + path.string() + " (disk full?)");
    files.push_back({name, image.size(), hash.hex_digest()});
    total += image.size();
  }
  if (pause_seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_seconds));
  engine::publish_checkpoint(checkpoints_dir, staging, {set.info.step, set.info.state_hash, set.info.world_size}, files, keep);
  return total;
}

}  // namespace strata
