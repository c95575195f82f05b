/* The GPU path through the C API. With an NVIDIA driver and device: blocks
 * make round trips device -> region -> device by DMA, gather and scatter
 * match a CPU reference, and segments outside the payload area are refused.
 * Without one: every GPU call reports CXLKV_RESULT_CUDA_UNAVAILABLE, and the
 * program exits 2. Device memory comes from the driver API, loaded with
 * dlopen (no CUDA headers or toolkit needed to build this). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <string.h>

#include "check.h"

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_primary_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_alloc_t)(uint64_t *, size_t);
typedef int (*cu_free_t)(uint64_t);
typedef int (*cu_htod_t)(uint64_t, const void *, size_t);
typedef int (*cu_dtoh_t)(void *, uint64_t, size_t);

static struct {
  cu_alloc_t alloc;
  cu_free_t free;
  cu_htod_t htod;
  cu_dtoh_t dtoh;
} cu;

/* dlsym's object pointer, converted as POSIX allows (ISO C has no cast). */
#define SYM(lib, name, fn)             \
  do {                                 \
    void *p_ = dlsym(lib, name);       \
    memcpy(&(fn), &p_, sizeof(fn));    \
  } while (0)

/* A context on device 0, or 0 when there is no driver or device. */
static int open_cuda(void) {
  const char *off = getenv("CXLKV_CUDA");
  if (off && (strcmp(off, "off") == 0 || strcmp(off, "0") == 0)) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return 0;
  cu_init_t init;
  cu_device_get_t get;
  cu_primary_retain_t retain;
  cu_ctx_set_t set;
  SYM(lib, "cuInit", init);
  SYM(lib, "cuDeviceGet", get);
  SYM(lib, "cuDevicePrimaryCtxRetain", retain);
  SYM(lib, "cuCtxSetCurrent", set);
  SYM(lib, "cuMemAlloc_v2", cu.alloc);
  SYM(lib, "cuMemFree_v2", cu.free);
  SYM(lib, "cuMemcpyHtoD_v2", cu.htod);
  SYM(lib, "cuMemcpyDtoH_v2", cu.dtoh);
  if (!init || !get || !retain || !set || !cu.alloc || !cu.free || !cu.htod || !cu.dtoh) return 0;
  int dev = 0;
  void *ctx = NULL;
  if (init(0) != 0 || get(&dev, 0) != 0 || retain(&ctx, dev) != 0 || set(ctx) != 0) return 0;
  return 1;
}

#define SIZE (256 * 1024 + 3)
#define PIECES 300
#define PIECE 800

int main(void) {
  cxlkv_region *r = NULL;
  OK(cxlkv_region_memfd(64u << 20, false, &r));
  cxlkv_capacities caps;
  OK(cxlkv_capacities_default(&caps));
  caps.chunk_shift = 20;
  OK(cxlkv_region_format(r, &caps, CXLKV_FLUSH_AUTO));
  cxlkv_node *node = NULL;
  OK(cxlkv_node_attach(r, NULL, &node));
  cxlkv_key keys[3] = {{1, 1}, {2, 2}, {3, 3}};
  cxlkv_cuda_segment meta = {0, 4096, 64};

  if (!open_cuda()) {
    EXPECT(cxlkv_cuda_register(node, 0), CXLKV_RESULT_CUDA_UNAVAILABLE);
    EXPECT(cxlkv_cuda_to_device(node, &meta, 1, NULL), CXLKV_RESULT_CUDA_UNAVAILABLE);
    EXPECT(cxlkv_cuda_synchronize(node, NULL), CXLKV_RESULT_CUDA_UNAVAILABLE);
    OK(cxlkv_node_detach(node));
    cxlkv_region_close(r);
    printf("C API test_cuda: CUDA unavailable, reported as such (%d checks)\n", checks_run);
    return 2;
  }
  OK(cxlkv_cuda_register(node, 0));
  OK(cxlkv_cuda_register(node, 0));
  EXPECT(cxlkv_cuda_register(node, 7), CXLKV_RESULT_INVALID_ARGUMENT);

  static unsigned char body[SIZE], back[SIZE];
  for (size_t i = 0; i < SIZE; i++) body[i] = (unsigned char)(i * 7 + 1);
  uint64_t da = 0, db = 0;
  CHECK(cu.alloc(&da, SIZE) == 0 && cu.alloc(&db, SIZE) == 0);
  CHECK(cu.htod(da, body, SIZE) == 0);

  /* Device -> reserved block by DMA, published after the stream. */
  cxlkv_reserve_item it = {keys[0], SIZE, 16, 0};
  cxlkv_block b;
  cxlkv_result st;
  OK(cxlkv_reserve(node, 5, &it, 1, &b, &st, NULL));
  CHECK(st == CXLKV_RESULT_OK);
  cxlkv_cuda_segment in = {b.offset, da, SIZE};
  OK(cxlkv_cuda_from_device(node, &in, 1, NULL));
  OK(cxlkv_cuda_publish_after(node, NULL, &b, 1, &st));
  CHECK(st == CXLKV_RESULT_OK);

  /* Acquired block -> device by DMA, compared on the host. */
  OK(cxlkv_acquire(node, 5, keys, 1, &b, &st, NULL));
  CHECK(st == CXLKV_RESULT_OK && memcmp(b.data, body, SIZE) == 0);
  cxlkv_cuda_segment out = {b.offset, db, SIZE};
  OK(cxlkv_cuda_to_device(node, &out, 1, NULL));
  OK(cxlkv_cuda_synchronize(node, NULL));
  CHECK(cu.dtoh(back, db, SIZE) == 0 && memcmp(back, body, SIZE) == 0);

  /* Gather 300 reversed pieces (3 launches), then scatter them back. */
  static cxlkv_cuda_segment segs[PIECES];
  for (int i = 0; i < PIECES; i++) {
    segs[i].region_offset = b.offset + (uint64_t)i * PIECE;
    segs[i].device_ptr = db + (uint64_t)(PIECES - 1 - i) * PIECE;
    segs[i].len = PIECE;
  }
  OK(cxlkv_cuda_gather(node, segs, PIECES, NULL));
  OK(cxlkv_cuda_synchronize(node, NULL));
  CHECK(cu.dtoh(back, db, PIECES * PIECE) == 0);
  size_t bad = 0;
  for (int i = 0; i < PIECES; i++) bad += memcmp(back + (PIECES - 1 - i) * PIECE, body + i * PIECE, PIECE) != 0;
  CHECK(bad == 0);
  OK(cxlkv_release(node, &b, 1));
  cxlkv_reserve_item it2 = {keys[1], PIECES * PIECE, 16, 0};
  OK(cxlkv_reserve(node, 5, &it2, 1, &b, &st, NULL));
  for (int i = 0; i < PIECES; i++) segs[i].region_offset = b.offset + (uint64_t)i * PIECE;
  OK(cxlkv_cuda_scatter(node, segs, PIECES, NULL));
  OK(cxlkv_cuda_publish_after(node, NULL, &b, 1, &st));
  CHECK(st == CXLKV_RESULT_OK);
  OK(cxlkv_acquire(node, 5, &keys[1], 1, &b, &st, NULL));
  CHECK(st == CXLKV_RESULT_OK && memcmp(b.data, body, PIECES * PIECE) == 0);
  OK(cxlkv_release(node, &b, 1));

  /* Never a DMA over metadata or outside the region. */
  meta.device_ptr = db;
  EXPECT(cxlkv_cuda_to_device(node, &meta, 1, NULL), CXLKV_RESULT_OUT_OF_BOUNDS);
  EXPECT(cxlkv_cuda_from_device(node, &meta, 1, NULL), CXLKV_RESULT_OUT_OF_BOUNDS);
  EXPECT(cxlkv_cuda_gather(node, &meta, 1, NULL), CXLKV_RESULT_OUT_OF_BOUNDS);
  cxlkv_cuda_segment beyond = {64u << 20, db, 64};
  EXPECT(cxlkv_cuda_scatter(node, &beyond, 1, NULL), CXLKV_RESULT_OUT_OF_BOUNDS);
  cxlkv_cuda_segment wraps = {UINT64_MAX - 8, db, 64};
  EXPECT(cxlkv_cuda_scatter(node, &wraps, 1, NULL), CXLKV_RESULT_INVALID_ARGUMENT);
  cxlkv_cuda_segment null_dev = {b.offset, 0, 64};
  EXPECT(cxlkv_cuda_to_device(node, &null_dev, 1, NULL), CXLKV_RESULT_INVALID_ARGUMENT);

  CHECK(cu.free(da) == 0 && cu.free(db) == 0);
  size_t nf = 1;
  OK(cxlkv_check(node, NULL, 0, &nf));
  CHECK(nf == 0);
  OK(cxlkv_node_detach(node));
  cxlkv_region_close(r);
  printf("C API test_cuda: %d checks passed on the GPU\n", checks_run);
  return 0;
}
