// Inside the shim (not its C ABI, which is c10d.h): how every entry point of c10d.cpp, ops.cpp
// and runtime.cpp turns an exception into a status code and a thread-local message, so nothing
// unwinds into Rust, and the check of a tensor an entry point works on in place.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "c10d.h"

namespace shim {

// The last failure's message on this thread (`c10d_last_error`), one for every source file.
inline thread_local std::string last_error;

inline int fail(int code, std::string message) {
  last_error = std::move(message);
  return code;
}

// Runs `body`, mapping every exception to a status code and a message.
template <typename F>
int guarded(const char* what, F&& body) {
  try {
    body();
    return C10D_OK;
  } catch (const c10::Error& e) {
    return fail(C10D_ERR_TORCH, std::string(what) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(C10D_ERR_STD, std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(C10D_ERR_UNKNOWN, std::string(what) + ": unknown C++ exception");
  }
}

// Checks a tensor pointer before a collective or a multi-tensor kernel works on it in place.
inline void check_tensor(const at::Tensor* t, const char* name) {
  TORCH_CHECK(t != nullptr, name, " is a null tensor pointer");
  TORCH_CHECK(t->defined(), name, " is an undefined tensor");
  TORCH_CHECK(t->is_contiguous(), name, " must be contiguous for an in-place collective or multi-tensor kernel");
}

}  // namespace shim
