// The header compiles as C++17 (warnings as errors) and its types are usable
// from C++ as they are from C.
#include "cxlkv.h"

#include <type_traits>

static_assert(std::is_trivially_copyable<cxlkv_block>::value, "blocks are plain data");
static_assert(std::is_same<std::underlying_type<cxlkv_result>::type, uint32_t>::value, "32-bit results");
static_assert(CXLKV_RESULT_OK == 1000, "non-zero success");
static_assert(sizeof(cxlkv_key) == 16, "128-bit keys");

int main() {
  cxlkv_result r = cxlkv_node_id(nullptr, nullptr);
  return r == CXLKV_RESULT_NULL_PARAMETER ? 0 : 1;
}
