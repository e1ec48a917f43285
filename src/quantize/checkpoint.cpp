#include "quantize/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_write.h"
#include "core/error.h"

namespace lowbit {

namespace fs = std::filesystem;

namespace {

constexpr int kCheckpointVersion = 1;   // bump when a block file's layout changes
constexpr char kPartSep = '|';

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOWBIT_CHECK(in.good(), path, ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

QuantCheckpoint::QuantCheckpoint(const std::string& out_path, const std::string& run_json, int blocks, bool resume)
    : dir_(out_path + ".partial"), blocks_(blocks) {
  nlohmann::ordered_json run;
  run["checkpoint_version"] = kCheckpointVersion;
  run["blocks"] = blocks;
  run["run"] = nlohmann::json::parse(run_json);
  const std::string run_text = run.dump(1);
  const std::string run_path = dir_ + "/run.json";
  std::error_code ec;
  if (fs::exists(dir_, ec)) {
    LOWBIT_CHECK(resume, dir_, ": a checkpoint of an interrupted run is there; pass --resume to continue it, or delete "
                 "the directory to start over");
    LOWBIT_CHECK(fs::exists(run_path), dir_, ": not a lowbit checkpoint (no run.json); delete it to start over");
    const std::string have = read_text(run_path);
    LOWBIT_CHECK(have == run_text, dir_, ": the checkpoint is of a different run (method, options, source or "
                 "calibration differ); delete it or run with the same options");
    return;
  }
  fs::create_directories(dir_, ec);
  LOWBIT_CHECK(!ec, dir_, ": cannot create the checkpoint directory: ", ec.message());
  write_atomically(run_path, run_text);
}

std::string QuantCheckpoint::block_path(int l) const {
  char name[32];
  std::snprintf(name, sizeof name, "block-%05d.safetensors", l);
  return dir_ + "/" + name;
}

bool QuantCheckpoint::has_block(int l) const { return fs::exists(block_path(l)); }

int QuantCheckpoint::finished_blocks() const {
  int n = 0;
  for (int l = 0; l < blocks_; ++l) n += has_block(l) ? 1 : 0;
  return n;
}

int QuantCheckpoint::first_missing() const {
  for (int l = 0; l < blocks_; ++l)
    if (!has_block(l)) return l;
  return blocks_;
}

void QuantCheckpoint::save_block(int l, const std::map<std::string, PackedWeight>& packed,
                                 const std::map<std::string, double>& report) {
  std::vector<SafetensorsWriteTensor> tensors;
  std::map<std::string, std::string> meta;
  nlohmann::ordered_json linears = nlohmann::json::object();
  for (const auto& [name, pw] : packed) {
    nlohmann::ordered_json j;
    j["format"] = static_cast<int>(pw.format);
    j["shape"] = pw.shape;
    j["params"] = pw.params;
    std::vector<std::string> parts;
    for (const auto& [part, view] : pw.parts) {
      tensors.push_back({name + kPartSep + part, view.dtype, view.shape, view.data});
      parts.push_back(part);
    }
    j["parts"] = parts;
    linears[name] = j;
  }
  meta["linears"] = linears.dump();
  meta["report"] = nlohmann::json(report).dump();
  write_safetensors(block_path(l), tensors, meta);
}

std::map<std::string, PackedWeight> QuantCheckpoint::load_block(int l, std::map<std::string, double>* report) {
  const std::string path = block_path(l);
  auto f = std::make_shared<SafetensorsFile>(SafetensorsFile::open(path));
  open_.push_back(f);
  std::map<std::string, PackedWeight> out;
  const auto lin = f->metadata().find("linears");
  LOWBIT_CHECK(lin != f->metadata().end(), path, ": not a lowbit checkpoint block (no linears); delete the checkpoint");
  try {
    const nlohmann::json j = nlohmann::json::parse(lin->second);
    for (const auto& [name, d] : j.items()) {
      PackedWeight pw;
      pw.format = static_cast<FormatId>(d.at("format").get<int>());
      pw.shape = d.at("shape").get<std::vector<int64_t>>();
      pw.params = d.at("params").get<std::map<std::string, int64_t>>();
      for (const std::string& part : d.at("parts").get<std::vector<std::string>>()) {
        const TensorView* t = f->find(name + kPartSep + part);
        LOWBIT_CHECK(t != nullptr, path, ": missing part ", part, " of ", name);
        TensorView v = *t;
        v.name = part;
        pw.parts[part] = v;
      }
      out[name] = std::move(pw);
    }
    if (report != nullptr) {
      const auto r = f->metadata().find("report");
      if (r != f->metadata().end()) *report = nlohmann::json::parse(r->second).get<std::map<std::string, double>>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": corrupt checkpoint block (", e.what(), "); delete the checkpoint directory to start over");
  }
  return out;
}

void QuantCheckpoint::remove() {
  open_.clear();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace lowbit
