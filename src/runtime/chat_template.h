// Chat templates. Rather than run Jinja, lowbit recognises the template families in use (ChatML — SmolLM,
// Qwen2; Llama 3 headers; Llama 2 / Mistral [INST]) from the template text and formats with them. A
// template it does not recognise is refused with a clear message, never guessed.
#pragma once
#include <string>
#include <vector>

namespace lowbit {

struct ChatMessage {
  std::string role;     // system | user | assistant
  std::string content;
};

enum class ChatFormat { ChatML, Llama3, Llama2 };

// Detects the family; the default system prompt a template inserts (SmolLM2 does) is returned in default_system.
ChatFormat detect_chat_format(const std::string& jinja, std::string* default_system);
// Formats messages and opens the assistant turn (add_generation_prompt=True). bos is prepended where the
// family's template writes it (Llama 2/3).
std::string apply_chat_template(const std::string& jinja, const std::vector<ChatMessage>& messages,
                                const std::string& bos_text);

}  // namespace lowbit
