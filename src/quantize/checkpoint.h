// Checkpoints of a running quantization, so an interrupted or crashed run loses at most the block it was on.
// Beside the output file, `<out>.partial/` holds:
//   run.json             what the run is (method JSON, source path, block count): --resume refuses a different run
//   block-00012.safetensors   the packed linears of finished block 12 (tensors "<weight name>|<part>", each linear's
//                        format, shape and params in the metadata) and the block's report figures
// Each block file is written atomically, so a block is either wholly there or absent. The final .lowbit file is
// assembled from the block files (memory-mapped: no copy of the packed model in host memory) and written atomically;
// the directory is removed only after that succeeds. A run without --resume refuses to start over an existing
// checkpoint (it would discard finished work), naming both ways out.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/weight_set.h"

namespace lowbit {

class QuantCheckpoint {
 public:
  // run_json: a JSON object describing the run; resume: continue an existing checkpoint (which must describe the
  // same run), else start one (refused when one exists).
  QuantCheckpoint(const std::string& out_path, const std::string& run_json, int blocks, bool resume);
  const std::string& dir() const { return dir_; }
  int blocks() const { return blocks_; }
  bool has_block(int l) const;
  int finished_blocks() const;
  // The first block not yet saved (blocks() when all are).
  int first_missing() const;
  // Saves block l atomically. report: numbers to restore into the summary on resume (name -> value).
  void save_block(int l, const std::map<std::string, PackedWeight>& packed, const std::map<std::string, double>& report);
  // The packed linears of a saved block, viewing its memory-mapped file (kept open by this object).
  std::map<std::string, PackedWeight> load_block(int l, std::map<std::string, double>* report = nullptr);
  // Deletes the directory (after the final file is written).
  void remove();

 private:
  std::string block_path(int l) const;
  std::string dir_;
  int blocks_ = 0;
  std::vector<std::shared_ptr<SafetensorsFile>> open_;
};

}  // namespace lowbit
