// The tokenizer stored in a GGUF file's metadata (llama.cpp's tokenizer.ggml.* keys) as a VocabData, shared by
// the model loader and the tests.
#pragma once
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

namespace lowbit {

// Reads tokenizer.ggml.model ("llama" -> sentencepiece BPE, "gpt2" -> byte-level BPE), .pre, .tokens, .scores,
// .token_type, .merges, .bos/.eos/.unknown/.padding_token_id, .add_bos_token, .add_space_prefix and
// tokenizer.chat_template. Errors name the file: "<path>: unsupported tokenizer model \"bert\" ...".
VocabData vocab_from_gguf(const GgufFile& gguf);

}  // namespace lowbit
