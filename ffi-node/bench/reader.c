/* The C side of ffi-node/bench/bench.js: reads every block of a working set
 * once right after attaching ("first"), once more ("again"), through
 * cxlkv_get into a preallocated buffer, then pins each block through
 * cxlkv_acquire + cxlkv_release, in a random order, one key a call, timing
 * each call. Prints one JSON line of nanosecond percentiles.
 *
 *   reader REGION LOCAL_DIR FLUSH_MODE SIZE N
 */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cxlkv.h"

#define NS 13

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void shuffle(uint32_t *v, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(next() % i);
    uint32_t t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

static int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void report(const char *name, uint64_t *lat, size_t n, int last) {
  qsort(lat, n, sizeof *lat, cmp);
  printf("\"%s\":[%llu,%llu]%s", name, (unsigned long long)lat[n / 2], (unsigned long long)lat[(n * 99) / 100],
         last ? "" : ",");
}

static struct cxlkv_key key(uint32_t i) {
  struct cxlkv_key k;
  uint64_t hi;
  memcpy(&hi, "bench-nd", 8);
  k.lo = i;
  k.hi = hi;
  return k;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: reader REGION LOCAL_DIR FLUSH_MODE SIZE N\n");
    return 2;
  }
  size_t size = strtoull(argv[4], NULL, 10), n = strtoull(argv[5], NULL, 10);
  struct cxlkv_region *region = NULL;
  struct cxlkv_node *node = NULL;
  struct cxlkv_node_options o;
  cxlkv_node_options_default(&o);
  o.flush_mode = (uint32_t)atoi(argv[3]);
  o.local_dir = argv[2];
  if (cxlkv_region_open(argv[1], &region) != CXLKV_RESULT_OK || cxlkv_node_attach(region, &o, &node) != CXLKV_RESULT_OK) {
    char msg[256] = "";
    size_t w = 0;
    cxlkv_last_error(msg, sizeof msg, &w);
    fprintf(stderr, "attach: %s\n", msg);
    return 1;
  }
  uint32_t *order = malloc(n * sizeof *order);
  uint64_t *lat = malloc(n * sizeof *lat);
  unsigned char *buf = malloc(size);
  for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
  printf("{");
  const char *names[2] = {"get_first", "get_again"};
  for (int pass = 0; pass < 2; pass++) {
    shuffle(order, n);
    for (size_t i = 0; i < n; i++) {
      struct cxlkv_iovec part = {buf, size};
      struct cxlkv_get_item it = {key(order[i]), &part, 1};
      uint64_t len = 0;
      cxlkv_result st = CXLKV_RESULT_OK;
      uint64_t t = now_ns();
      cxlkv_result r = cxlkv_get(node, NS, &it, 1, &len, &st);
      lat[i] = now_ns() - t;
      if (r != CXLKV_RESULT_OK || st != CXLKV_RESULT_OK || len != size || buf[0] != (unsigned char)(order[i] & 0xff)) {
        fprintf(stderr, "get %u: %d %d %llu\n", order[i], (int)r, (int)st, (unsigned long long)len);
        return 1;
      }
    }
    report(names[pass], lat, n, 0);
  }
  shuffle(order, n);
  for (size_t i = 0; i < n; i++) {
    struct cxlkv_key k = key(order[i]);
    struct cxlkv_block b;
    cxlkv_result st;
    size_t got = 0;
    uint64_t t = now_ns();
    cxlkv_result r = cxlkv_acquire(node, NS, &k, 1, &b, &st, &got);
    cxlkv_result r2 = cxlkv_release(node, &b, 1);
    lat[i] = now_ns() - t;
    if (r != CXLKV_RESULT_OK || got != 1 || r2 != CXLKV_RESULT_OK || b.len != size) {
      fprintf(stderr, "acquire %u: %d %d\n", order[i], (int)r, (int)r2);
      return 1;
    }
  }
  report("acquire", lat, n, 1);
  printf("}\n");
  free(buf);
  free(lat);
  free(order);
  cxlkv_node_detach(node);
  cxlkv_region_close(region);
  return 0;
}
