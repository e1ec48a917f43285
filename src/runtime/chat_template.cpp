#include "runtime/chat_template.h"

#include "core/error.h"

namespace lowbit {

ChatFormat detect_chat_format(const std::string& jinja, std::string* default_system) {
  LOWBIT_CHECK(!jinja.empty(), "the model has no chat template; run without --chat");
  if (jinja.find("<|im_start|>") != std::string::npos) {
    // SmolLM2's template: "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}"
    const std::string open = "<|im_start|>system\n";
    size_t a = jinja.find(open);
    if (default_system != nullptr && a != std::string::npos) {
      a += open.size();
      const size_t b = jinja.find("<|im_end|>", a);
      if (b != std::string::npos) {
        std::string s = jinja.substr(a, b - a);
        // only a literal default, not a template expression
        if (s.find("{{") == std::string::npos && s.find("{%") == std::string::npos) *default_system = s;
      }
    }
    return ChatFormat::ChatML;
  }
  if (jinja.find("<|start_header_id|>") != std::string::npos) return ChatFormat::Llama3;
  if (jinja.find("[INST]") != std::string::npos) return ChatFormat::Llama2;
  fail("unrecognised chat template (supported families: ChatML, Llama 3, Llama 2/Mistral)");
}

std::string apply_chat_template(const std::string& jinja, const std::vector<ChatMessage>& messages,
                                const std::string& bos_text) {
  std::string default_system;
  const ChatFormat f = detect_chat_format(jinja, &default_system);
  std::string out;
  switch (f) {
    case ChatFormat::ChatML: {
      if (!default_system.empty() && (messages.empty() || messages[0].role != "system"))
        out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    }
    case ChatFormat::Llama3: {
      out += bos_text;
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatFormat::Llama2: {
      std::string system;
      size_t i = 0;
      if (!messages.empty() && messages[0].role == "system") system = messages[i++].content;
      for (; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role == "user") {
          std::string content = m.content;
          if (!system.empty()) {
            content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
            system.clear();
          }
          out += bos_text + "[INST] " + content + " [/INST]";
        } else if (m.role == "assistant") {
          out += " " + m.content + " </s>";
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace lowbit
