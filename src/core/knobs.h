// Every LOWBIT_* environment variable lowbit reads, declared once (name, type, default, purpose) in knobs.cpp's
// table; code reads them only through this registry (a test fails on any other getenv, on a knob no code reads, and
// on docs/KNOBS.md drifting from the table — docs/KNOBS.md is knobs_markdown()'s output).
//
// Tuning knobs are A/B switches for measurements: the defaults are what the benchmarks measured fastest. Each is read
// from the environment once, on first use; set_knob() overrides it in-process (the benchmarks time both settings of a
// switch in one run; a captured decode graph is keyed on the switches that change what it launches).
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace lowbit {

enum class Knob : uint8_t {
  // Paths.
  SharedDir,            // string: the shared data folder (calibration / evaluation text, stories260K)
  Cache,                // string: where setup puts fetched models
  // GPU kernel choice (backend_cuda/dispatch/kernel_choice.h).
  Int8Tables,           // bool
  LutStream,            // bool
  MixedMma,             // bool
  FusedGemm,            // bool
  DenseGemv,            // bool
  QuikFused,            // int: -1 rule, 0, 1
  QuikProducerAct,      // bool
  QuikAttentionAct,     // int: 0 off, -1 decode steps, 1 always
  QuikGemvChunk,        // int: 0 rule, 16 or 32 codes per lane and step of the integer-activation GEMV
  // GPU kernel forms and fusions.
  GroupGemv,            // bool
  FoldSwiglu,           // bool
  ProducerXmax,         // bool
  GemvBalance,          // bool
  I8Pack,               // int: -1 rule, 0, 1
  I8Stages,             // int: 0 rule, 2, 3
  LutStreamRingX,       // bool
  FoldRope,             // bool
  MixedStep,            // bool
  ClusterCombine,       // bool
  AttnSplits,           // int: 0 rule, else forced
  TcAttention,          // bool
  Pdl,                  // bool
  PdlMask,              // int
  // Tests.
  SourceDir,            // string
  TokenizerJsonOut,     // string
  RssModel,             // string
  // Scripts (read by scripts/*.sh, declared here so that the one list and docs/KNOBS.md cover them).
  DemoCalib,            // int
  BuildDir,             // string
};

enum class KnobType : uint8_t { Bool, Int, String };

struct KnobInfo {
  Knob id;
  const char* name;         // the environment variable
  KnobType type;
  const char* default_value;  // as the environment would spell it ("" for an unset string)
  const char* values;       // what it accepts
  const char* purpose;      // one line
};

std::span<const KnobInfo> knob_table();
const KnobInfo& knob_info(Knob k);

// The value: the override if set_knob() was called, else the environment's (read once) when it is a valid value,
// else the default. A malformed value (LOWBIT_INT8_TABLES=yes) is ignored with one warning on stderr.
bool knob_bool(Knob k);
int64_t knob_int(Knob k);
std::string knob_string(Knob k);   // "" when unset
bool knob_is_set(Knob k);          // set in the environment or overridden
void set_knob(Knob k, int64_t value);   // Bool and Int knobs
void reset_knob(Knob k);                // back to the environment's value

// docs/KNOBS.md, generated from the table.
std::string knobs_markdown();

}  // namespace lowbit
