#include "tensorboard.h"

#include <chrono>
#include <cstring>

#include <unistd.h>

#include <boost/crc.hpp>

#include "strata/errors.h"

namespace strata::engine {
namespace {

// TFRecord's masked CRC-32C (Castagnoli): rotate right by 15, add a constant, so a CRC of data
// that itself holds CRCs stays well distributed.
uint32_t masked_crc32c(const char* data, size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i) & 0xff));
}

// Protocol buffer wire format: a key is (field << 3 | wire type) as a varint.
void varint(std::string& out, uint64_t value) {
  while (value >= 0x80) out.push_back(static_cast<char>(value | 0x80)), value >>= 7;
  out.push_back(static_cast<char>(value));
}
void field_double(std::string& out, int field, double value) {
  varint(out, static_cast<uint64_t>(field) << 3 | 1);
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  put_le(out, bits, 8);
}
void field_float(std::string& out, int field, float value) {
  varint(out, static_cast<uint64_t>(field) << 3 | 5);
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  put_le(out, bits, 4);
}
void field_varint(std::string& out, int field, int64_t value) {
  varint(out, static_cast<uint64_t>(field) << 3 | 0);
  varint(out, static_cast<uint64_t>(value));
}
void field_bytes(std::string& out, int field, const std::string& bytes) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}

double wall_time() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// Summary.value (field 1): Summary.Value { tag = 1; simple_value = 2 }.
void add_scalar(std::string& summary, const std::string& tag, double value) {
  std::string v;
  field_bytes(v, 1, tag);
  field_float(v, 2, static_cast<float>(value));
  field_bytes(summary, 1, v);
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir, double flops_per_token, double peak_tflops)
    : flops_per_token_(flops_per_token), peak_flops_(peak_tflops * 1e12) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // One file per start of the run: a resume (or a supervisor's restart) within the same second
  // as the start before it gets a name of its own from its process id.
  path_ = dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time())) + "." + host + "." + std::to_string(getpid()));
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw UserError("[job] tensorboard: cannot write " + path_.string());
  std::string event;  // Event { wall_time = 1; step = 2; file_version = 3 }
  field_double(event, 1, wall_time());
  field_bytes(event, 3, "brain.Event:2");
  record(event);
}

void TensorBoardWriter::write(const StepRecord& r) {
  std::string summary;
  add_scalar(summary, "loss", r.loss);
  if (r.val_loss) add_scalar(summary, "val_loss", *r.val_loss);
  add_scalar(summary, "lr", r.lr);
  add_scalar(summary, "grad_norm", r.grad_norm);
  add_scalar(summary, "step_ms", r.step_ms);
  if (r.step_ms > 0) {
    const double tokens_per_s = static_cast<double>(r.tokens) / (r.step_ms / 1000);
    add_scalar(summary, "tokens_per_s", tokens_per_s);
    if (peak_flops_ > 0) add_scalar(summary, "mfu", flops_per_token_ * tokens_per_s / peak_flops_);
  }
  for (const auto& [name, value] : r.extra) add_scalar(summary, name, value);
  scalar_event(r.step, summary);
}

void TensorBoardWriter::scalar_event(int64_t step, const std::string& summary) {
  std::string event;  // Event { wall_time = 1; step = 2; summary = 5 }
  field_double(event, 1, wall_time());
  field_varint(event, 2, step);
  field_bytes(event, 5, summary);
  record(event);
}

void TensorBoardWriter::record(const std::string& event) {
  std::string header;
  put_le(header, event.size(), 8);
  std::string framed = header;
  put_le(framed, masked_crc32c(header.data(), header.size()), 4);
  framed += event;
  put_le(framed, masked_crc32c(event.data(), event.size()), 4);
  out_.write(framed.data(), static_cast<std::streamsize>(framed.size()));
  if (!out_.flush()) throw UserError("[job] tensorboard: cannot write " + path_.string() + " (a full disk?)");
}

}  // namespace strata::engine
