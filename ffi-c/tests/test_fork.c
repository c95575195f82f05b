/* Two processes: a prefill child publishes blocks into a region file in
 * /dev/shm, the decode parent finds them by key and verifies every byte.
 * An alarm is the watchdog: nothing here may hang. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define BLOCKS 64
#define BLOCK (64 * 1024)

static unsigned char byte_of(const cxlkv_key *k, size_t at) {
  return (unsigned char)((k->lo >> (at % 13)) ^ (k->hi + at));
}

static void chain(cxlkv_key *keys) {
  uint32_t toks[BLOCKS * 16];
  for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) toks[i] = (uint32_t)(i * 7919u % 32000u);
  size_t n = 0;
  OK(cxlkv_chain_keys(NULL, toks, BLOCKS * 16, 16, keys, BLOCKS, &n));
  CHECK(n == BLOCKS);
}

static cxlkv_node *attach(const char *path, cxlkv_region **r) {
  OK(cxlkv_region_open(path, r));
  cxlkv_node *node = NULL;
  OK(cxlkv_node_attach(*r, NULL, &node));
  return node;
}

static const cxlkv_namespace NSF = {"fork-test", 0, 0, 0, 1, 0, 16, 0, NULL, 0};

static int prefill(const char *path) {
  cxlkv_region *r = NULL;
  cxlkv_node *node = attach(path, &r);
  /* Registered by each process: both get the same id. */
  uint32_t ns = 0;
  OK(cxlkv_namespace_register(node, &NSF, &ns));
  cxlkv_key keys[BLOCKS];
  chain(keys);
  /* Half zero-copy (reserve, store, publish), half copied (put). */
  for (int i = 0; i < BLOCKS; i++) {
    if (i % 2 == 0) {
      cxlkv_reserve_item it = {keys[i], BLOCK, 16, 0};
      cxlkv_block b;
      cxlkv_result st;
      OK(cxlkv_reserve(node, ns, &it, 1, &b, &st, NULL));
      CHECK(st == CXLKV_RESULT_OK);
      for (size_t j = 0; j < BLOCK; j++) ((unsigned char *)b.data)[j] = byte_of(&keys[i], j);
      OK(cxlkv_publish(node, &b, 1, &st));
      CHECK(st == CXLKV_RESULT_OK);
    } else {
      static unsigned char buf[BLOCK];
      for (size_t j = 0; j < BLOCK; j++) buf[j] = byte_of(&keys[i], j);
      cxlkv_iovec part = {buf, BLOCK};
      cxlkv_put_item it = {keys[i], 16, 0, &part, 1};
      cxlkv_result st;
      OK(cxlkv_put(node, ns, &it, 1, &st));
      CHECK(st == CXLKV_RESULT_OK);
    }
  }
  OK(cxlkv_node_detach(node));
  cxlkv_region_close(r);
  return 0;
}

int main(void) {
  alarm(120);
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/cxlkv-ctest-%d", (int)getpid());
  cxlkv_region *r = NULL;
  OK(cxlkv_region_create(path, 64u << 20, false, &r));
  cxlkv_capacities caps;
  OK(cxlkv_capacities_default(&caps));
  caps.chunk_shift = 20;
  OK(cxlkv_region_format(r, &caps, CXLKV_FLUSH_AUTO));
  cxlkv_region_close(r);

  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) _exit(prefill(path));

  cxlkv_node *node = attach(path, &r);
  uint32_t ns = 0;
  OK(cxlkv_namespace_register(node, &NSF, &ns));
  cxlkv_key keys[BLOCKS];
  chain(keys);
  /* Decode: poll for the whole chain, then verify in place. */
  size_t prefix = 0;
  while (prefix < BLOCKS) {
    OK(cxlkv_lookup(node, ns, keys, BLOCKS, NULL, &prefix));
    if (prefix < BLOCKS) {
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cxlkv_block blocks[BLOCKS];
  cxlkv_result st[BLOCKS];
  size_t n = 0;
  OK(cxlkv_acquire(node, ns, keys, BLOCKS, blocks, st, &n));
  CHECK(n == BLOCKS);
  size_t bad = 0;
  for (int i = 0; i < BLOCKS; i++) {
    CHECK(st[i] == CXLKV_RESULT_OK && blocks[i].len == BLOCK);
    for (size_t j = 0; j < BLOCK; j++) bad += ((unsigned char *)blocks[i].data)[j] != byte_of(&keys[i], j);
  }
  CHECK(bad == 0);
  OK(cxlkv_release(node, blocks, BLOCKS));
  cxlkv_stats s;
  OK(cxlkv_node_stats(node, &s));
  CHECK(s.live_blocks == BLOCKS && s.alive_mask != 0 && s.dead_mask == 0);
  size_t nf = 1;
  OK(cxlkv_check(node, NULL, 0, &nf));
  CHECK(nf == 0);
  OK(cxlkv_node_detach(node));
  cxlkv_region_close(r);
  unlink(path);
  printf("C API test_fork: %d checks passed\n", checks_run);
  return 0;
}
