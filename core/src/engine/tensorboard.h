// TensorBoard event files ([job] tensorboard = true): rank 0 writes every step's figures under
// RUN_DIR/tensorboard/ for `tensorboard --logdir RUN_DIR/tensorboard`.
//
// The format is TensorBoard's: a file events.out.tfevents.<seconds>.<host> of TFRecords (each a
// little-endian uint64 length, its masked CRC-32C, the bytes, their masked CRC-32C), each record
// one serialized `Event` protocol buffer: the first says file_version "brain.Event:2", then one
// per step with a `Summary` of scalar values (tag, simple_value). Those three messages use five
// fields, so they are encoded here by the protobuf wire rules (varint keys, 64-bit double, 32-bit
// float, length-delimited strings and messages) instead of building protoc's generated code; the
// CRC is Boost.CRC's. `interop.tensorboard` reads the files back with the tensorboard package's
// own reader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "strata/core/trainer.h"

namespace strata::engine {

class TensorBoardWriter {
 public:
  // Opens a new event file in `dir` (made if missing). `flops_per_token` and `peak_tflops` give
  // MFU, as the console's line does; 0 peak: no MFU.
  TensorBoardWriter(const std::filesystem::path& dir, double flops_per_token, double peak_tflops);
  // The step's figures as scalars: loss, val_loss, lr, grad_norm, tokens_per_s, step_ms, mfu and
  // every extra (memory figures, passes' own); flushed, so a live TensorBoard sees each step.
  void write(const StepRecord& record);

 private:
  void scalar_event(int64_t step, const std::string& summary);
  void record(const std::string& event);
  std::ofstream out_;
  std::filesystem::path path_;
  double flops_per_token_, peak_flops_;
};

}  // namespace strata::engine
