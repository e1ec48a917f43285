// lowbit's public C++ API: include this one header, link lowbit::lowbit (CMake: find_package(lowbit CONFIG)).
//   lowbit/model.h     open a model or .lowbit file, tokenize, generate, score perplexity, time it
//   lowbit/quantize.h  quantize a model into a .lowbit file (RTN, GPTQ, any-precision, 2/4/16 mixed, QUIK)
//   lowbit/inspect.h   what a model file holds, tensor by tensor
//   lowbit/convert.h   export a model as a Hugging Face directory
//   lowbit/system.h    CPU threads, CUDA availability
//   lowbit/error.h     lowbit::Error, thrown with a one-line message for every bad input
// Everything but lowbit::Error lives in namespace lowbit::api. The headers need only the C++20 standard library.
#pragma once

#include "lowbit/convert.h"
#include "lowbit/error.h"
#include "lowbit/inspect.h"
#include "lowbit/model.h"
#include "lowbit/quantize.h"
#include "lowbit/system.h"
#include "lowbit/types.h"
