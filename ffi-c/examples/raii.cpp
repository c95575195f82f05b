// cxlkv from C++17: a small RAII wrapper over cxlkv.h. Handles close in
// destructors, failures throw, and a pinned batch releases its blocks when
// it goes out of scope. Build: c++ -std=c++17 raii.cpp $(pkg-config --cflags --libs cxlkv)
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "cxlkv.h"

namespace cxlkv {

struct Error : std::runtime_error {
  cxlkv_result code;
  Error(const char *what, cxlkv_result r)
      : std::runtime_error(std::string(what) + ": " + cxlkv_result_str(r)), code(r) {}
};

inline void check(const char *what, cxlkv_result r) {
  if (r != CXLKV_RESULT_OK) throw Error(what, r);
}

struct RegionClose {
  void operator()(cxlkv_region *r) const { cxlkv_region_close(r); }
};
struct NodeDetach {
  void operator()(cxlkv_node *n) const { cxlkv_node_detach(n); }
};
using Region = std::unique_ptr<cxlkv_region, RegionClose>;
using Node = std::unique_ptr<cxlkv_node, NodeDetach>;

inline Region create(const std::string &path, uint64_t size) {
  cxlkv_region *r = nullptr;
  check("create", cxlkv_region_create(path.c_str(), size, true, &r));
  Region region(r);
  check("format", cxlkv_region_format(r, nullptr, CXLKV_FLUSH_DEFAULT));
  return region;
}

inline Node attach(const Region &region) {
  cxlkv_node *n = nullptr;
  check("attach", cxlkv_node_attach(region.get(), nullptr, &n));
  return Node(n);
}

// Blocks pinned by acquire; released when destroyed.
class Pinned {
 public:
  Pinned(const Node &node, uint32_t ns, const std::vector<cxlkv_key> &keys)
      : node_(node.get()), blocks_(keys.size()), status_(keys.size()) {
    check("acquire", cxlkv_acquire(node_, ns, keys.data(), keys.size(), blocks_.data(), status_.data(), nullptr));
  }
  Pinned(const Pinned &) = delete;
  Pinned &operator=(const Pinned &) = delete;
  ~Pinned() { cxlkv_release(node_, blocks_.data(), blocks_.size()); }
  bool found(size_t i) const { return status_[i] == CXLKV_RESULT_OK; }
  const cxlkv_block &operator[](size_t i) const { return blocks_[i]; }

 private:
  cxlkv_node *node_;
  std::vector<cxlkv_block> blocks_;
  std::vector<cxlkv_result> status_;
};

}  // namespace cxlkv

int main() {
  try {
    std::string path = "/dev/shm/cxlkv-raii-" + std::to_string(getpid());
    cxlkv::Region region = cxlkv::create(path, 64u << 20);
    cxlkv::Node node = cxlkv::attach(region);
    const uint32_t ns = 7;
    std::vector<cxlkv_key> keys = {{1, 2}, {3, 4}};

    // Zero-copy write: reserve, fill in place, publish.
    cxlkv_reserve_item item{keys[0], 4096, 16, 0};
    cxlkv_block block;
    cxlkv_result st;
    cxlkv::check("reserve", cxlkv_reserve(node.get(), ns, &item, 1, &block, &st, nullptr));
    cxlkv::check("reserve (block 0)", st);
    std::memset(block.data, 0x42, block.len);
    cxlkv::check("publish", cxlkv_publish(node.get(), &block, 1, &st));
    cxlkv::check("publish (block 0)", st);

    {
      cxlkv::Pinned pinned(node, ns, keys);
      for (size_t i = 0; i < keys.size(); i++) {
        if (pinned.found(i)) {
          auto *p = static_cast<const unsigned char *>(pinned[i].data);
          std::printf("block %zu: %llu bytes, first byte 0x%02x\n", i, (unsigned long long)pinned[i].len, p[0]);
        } else {
          std::printf("block %zu: not cached\n", i);
        }
      }
    }  // released here

    node.reset();
    region.reset();
    unlink(path.c_str());
  } catch (const cxlkv::Error &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
