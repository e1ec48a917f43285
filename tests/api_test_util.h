// Shared by the tests that drive the public C++ API (lowbit/model.h): opening a model on the CPU, and expecting a
// one-line lowbit::Error.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "lowbit/error.h"
#include "lowbit/model.h"
#include "lowbit/system.h"

namespace lowbit::test {

// One CPU thread: the models these tests open are tiny (stories260K decodes ~1000x faster on one thread than on two
// threads sharing their cores with the other tests ctest runs beside this one), and both paths compared run on it.
inline api::Model open_cpu(const std::string& path) {
  api::set_cpu_threads(1);
  api::OpenOptions o;
  o.device = api::Device::Cpu;
  return api::Model::open(path, o);
}

// Expects f() to throw a one-line lowbit::Error containing phrase.
template <typename F>
void expect_api_error(F f, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "no error (expected '" << phrase << "')";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(phrase), std::string::npos) << "expected '" << phrase << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace lowbit::test
